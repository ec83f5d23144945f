"""A real gunicorn master registers itself in the discovery registry and deregisters when it stops."""
import os
import signal

import pytest

from discovery_app.registry import ServiceRegistry
from tests.processes import children_running
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
    # The registration process is looked for only among this gunicorn's children: other checkouts on
    # this host run their own, and signalling one of theirs failed their tests.
    server = gunicorn(workers=1, env={"WEB_SERVICE_NAME": "shoal-web-test"})
    registry = ServiceRegistry()
    wait_for(lambda: registry.instances("shoal-web-test"), timeout=30, what="the web instance registered")
    [registration] = children_running(server.proc.pid, "project.web_registration")

    os.kill(registration, signal.SIGTERM)
    wait_for(lambda: registry.instances("shoal-web-test") == [], timeout=30, what="deregistered on SIGTERM")
    wait_for(lambda: not children_running(server.proc.pid, "project.web_registration"), timeout=30,
             what="the registration process gone")
    output = "".join(server.lines)
    assert "Fatal Python error" not in output, output[-2000:]
