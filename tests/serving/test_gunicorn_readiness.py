"""The web tier is in the discovery registry only while a worker can serve: registered once one
answers /readyz, marked failing (clients skip it) while none does, passing again when one does."""
import os
import signal
import textwrap
import time

import pytest

from discovery_app.registry import ServiceRegistry
from tests.processes import children_running
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def gated_site(tmp_path):
    """A site whose URLconf (imported while a worker loads the app) waits until a file exists."""
    directory = tmp_path / "site"
    directory.mkdir()
    gate = tmp_path / "gate"
    (directory / "gate_settings.py").write_text(textwrap.dedent("""\
        from tests.settings import *  # noqa
        ROOT_URLCONF = "gate_urls"
        # Heartbeats (and so readiness probes) every second, so that the test need not wait long.
        DISCOVERY = {**globals().get("DISCOVERY", {}), "HEARTBEAT_INTERVAL": 1.0}
    """))
    (directory / "gate_urls.py").write_text(textwrap.dedent(f"""\
        import os
        import time

        while not os.path.exists({str(gate)!r}):
            time.sleep(0.1)

        from project.urls import urlpatterns  # noqa
    """))
    return directory, gate


def test_registered_only_once_a_worker_is_ready_and_marked_failing_while_none_answers(gunicorn, gated_site, redis,
                                                                                         settings):
    directory, gate = gated_site
    server = gunicorn(workers=1, wait=False, env={"PYTHONPATH": str(directory), "DJANGO_SETTINGS_MODULE": "gate_settings",
                                                  "WEB_SERVICE_NAME": "shoal-web-ready"})
    registry = ServiceRegistry()
    wait_for(lambda: children_running(server.proc.pid, "discovery_app.web_registration"), timeout=60,
             what="the registration process started")
    wait_for(lambda: "Booting worker" in server.output(), timeout=60, what="a worker booting")
    # The registration process polls /readyz twice a second; the worker is stuck loading the app.
    with pytest.raises(AssertionError, match="timed out"):
        wait_for(lambda: registry.instances("shoal-web-ready"), timeout=10, what="a registration (there must be none)")
    opened_at = time.time()
    gate.write_text("open")
    [instance] = wait_for(lambda: registry.instances("shoal-web-ready"), timeout=60, what="registered once ready")
    assert instance.registered_at >= opened_at - 0.5  # (Redis's clock, on this machine)
    assert not instance.failing
    # The line reaches us through the registration process's stderr pipe, which may trail the write to Redis.
    wait_for(lambda: "a worker answers" in server.output(), timeout=30, what="the registration's readiness line")

    # Every worker frozen: the instance is marked failing, and passing again once they thaw.
    [worker] = server.worker_pids()
    os.kill(worker, signal.SIGSTOP)
    try:
        wait_for(lambda: registry.instances("shoal-web-ready")[0].failing, timeout=60, what="marked failing")
    finally:
        os.kill(worker, signal.SIGCONT)
    wait_for(lambda: not registry.instances("shoal-web-ready")[0].failing, timeout=60, what="passing again")
