"""project.web_registration against a stand-in Registrar with the interface of discovery_app.registrar.

The real registrar is written in another branch; this pins down what the gunicorn hook's helper
does with it: register settings.WEB_SERVICE_NAME at the given address, deregister at stdin EOF.
"""
import signal
import sys
import types

import pytest

from project import web_registration


class FakeRegistrar:
    made = []

    def __init__(self, service, address, port, metadata=None, interval=None, registry=None):
        self.args = (service, address, port, metadata)
        self.calls = []
        FakeRegistrar.made.append(self)

    def start(self):
        self.calls.append("start")

    def stop(self):
        self.calls.append("stop")


@pytest.fixture
def fake_registrar(monkeypatch):
    FakeRegistrar.made = []
    monkeypatch.setitem(sys.modules, "discovery_app.registrar", types.SimpleNamespace(Registrar=FakeRegistrar))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield FakeRegistrar
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def test_registers_the_web_service_and_deregisters_when_stdin_closes(fake_registrar, settings, monkeypatch):
    settings.WEB_SERVICE_NAME = "shoal-web-test"
    monkeypatch.setattr(sys, "stdin", open("/dev/null"))  # the master's pipe, already closed
    assert web_registration.main(["10.0.0.5", "8000", '{"workers": 2}']) == 0
    [registrar] = fake_registrar.made
    assert registrar.args == ("shoal-web-test", "10.0.0.5", 8000, {"workers": 2})
    assert registrar.calls == ["start", "stop"]


def test_without_a_registrar_it_exits_with_its_own_code(monkeypatch):
    monkeypatch.setitem(sys.modules, "discovery_app.registrar", None)  # import raises ImportError
    assert web_registration.main(["10.0.0.5", "8000"]) == web_registration.EXIT_UNAVAILABLE
