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
