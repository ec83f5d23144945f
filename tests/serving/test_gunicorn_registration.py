"""A real gunicorn master registers itself in the discovery registry and deregisters when it stops."""
import signal

import pytest

from discovery_app.registry import ServiceRegistry
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


def test_gunicorn_registers_the_web_instance_and_deregisters_on_stop(gunicorn, redis, settings):
    server = gunicorn(workers=1, env={"WEB_SERVICE_NAME": "shoal-web-test"})
    registry = ServiceRegistry()
    [instance] = wait_for(lambda: registry.instances("shoal-web-test"), timeout=30, what="the web instance registered")
    assert (instance.address, instance.port) == ("127.0.0.1", server.port)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0
    wait_for(lambda: registry.instances("shoal-web-test") == [], timeout=30, what="the web instance deregistered")
    output = "".join(server.lines)
    assert "deregistered" in output and "Fatal Python error" not in output, output[-2000:]


def test_the_registration_process_stops_cleanly_on_sigterm(gunicorn, redis, settings):
    # `make run` (honcho) and Ctrl-C signal the whole process group, the registration process too.
    import os
    from pathlib import Path

    server = gunicorn(workers=1, env={"WEB_SERVICE_NAME": "shoal-web-test"})
    registry = ServiceRegistry()
    wait_for(lambda: registry.instances("shoal-web-test"), timeout=30, what="the web instance registered")

    def registration_pid():
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and b"web_registration" in Path(f"/proc/{entry}/cmdline").read_bytes():
                    return int(entry)
            except OSError:
                continue

    os.kill(registration_pid(), signal.SIGTERM)
    wait_for(lambda: registry.instances("shoal-web-test") == [], timeout=30, what="deregistered on SIGTERM")
    wait_for(lambda: registration_pid() is None, timeout=30, what="the registration process gone")
    output = "".join(server.lines)
    assert "Fatal Python error" not in output, output[-2000:]
