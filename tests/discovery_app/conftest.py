import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from discovery_app.registry import ServiceRegistry
from tests.redis_server import free_port


class FakeClock:
    """A monotonic clock the test moves by hand (breaker cool-downs, cache ages)."""

    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


class HTTPService:
    """A real HTTP server in a thread that answers ``<name> <path>`` (or ``status``)."""

    def __init__(self, name, port=None, status=200):
        self.name = name
        self.status = status
        self.hits = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                service.hits.append((self.command, self.path))
                body = f"{service.name} {self.path}".encode()
                self.send_response(service.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port or 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.running = True

    def stop(self):
        if self.running:
            self.server.shutdown()
            self.server.server_close()  # the port now refuses connections
            self.thread.join(5)
            self.running = False


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def registry(redis):
    return ServiceRegistry()


@pytest.fixture
def http_service():
    services = []

    def start(name, **kwargs):
        service = HTTPService(name, **kwargs)
        services.append(service)
        return service

    yield start
    for service in services:
        service.stop()


@pytest.fixture
def closed_port():
    """A port nothing listens on: connections to it are refused at once."""
    return free_port()
