import os

from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"

    def ready(self):
        if os.environ.get("SHOAL_TEST_RELAY_DIE_AFTER_XADD"):
            die_after_xadd(os.environ["SHOAL_TEST_RELAY_DIE_AFTER_XADD"])


def die_after_xadd(marker):
    """Fault injection for the outbox tests: the first relay process to reach the marking step after
    its XADDs creates ``marker`` and SIGKILLs itself, as a crash between XADD and commit would."""
    import signal

    from streams_app.outbox.relay import Relay

    mark = Relay._mark

    def dying_mark(self, done, failed, now):
        if done:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, f"{len(done)}\n".encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        return mark(self, done, failed, now)

    Relay._mark = dying_mark
