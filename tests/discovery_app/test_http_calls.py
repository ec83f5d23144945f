"""DiscoveryClient.request as services use it: cookies, streaming, caller errors, timeouts, HTTPS."""
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from discovery_app.client import DiscoveryClient
from discovery_app.http import DeadlineExceeded


class Server:
    """A real HTTP server in a thread whose handler is a plain function of the request handler."""

    def __init__(self, answer):
        self.seen = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                server.seen.append((self.path, dict(self.headers)))
                answer(self)

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    started = []

    def start(answer):
        started.append(Server(answer))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def reply(handler, body=b"ok", status=200, headers=()):
    handler.send_response(status)
    for name, value in headers:
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def test_a_cookie_one_call_received_is_not_sent_on_later_calls(registry, server):
    def answer(handler):
        reply(handler, headers=[("Set-Cookie", "session=user-a; Path=/")])

    web = server(answer)
    registry.register("web", "127.0.0.1", web.port)
    registry.register("other", "127.0.0.1", web.port)  # another service on the same host
    client = DiscoveryClient(listen=False)
    assert client.request("web", "GET", "/login").cookies["session"] == "user-a"  # the caller still sees it
    client.request("web", "GET", "/for-user-b")
    client.request("other", "GET", "/elsewhere")
    assert [headers.get("Cookie") for _, headers in web.seen] == [None, None, None]
    # Cookies the caller passes explicitly still go out, on that call only.
    client.request("web", "GET", "/explicit", cookies={"mine": "1"})
    client.request("web", "GET", "/after")
    assert [headers.get("Cookie") for _, headers in web.seen[3:]] == ["mine=1", None]
    client.close()


def test_the_callers_own_errors_never_open_a_breaker(registry, server):
    web = server(reply)
    for _ in range(3):
        registry.register("web", "127.0.0.1", web.port)
    client = DiscoveryClient(listen=False, breaker_failures=2)
    for _ in range(15):
        with pytest.raises(requests.exceptions.InvalidHeader):
            client.request("web", "GET", "/", headers={"X-Bad": "a\nb"})
        with pytest.raises(requests.exceptions.InvalidURL):
            client.request("web", "GET", "/", proxies={"http": "http://[bad"})
    states = {client.breakers.state(i.instance_id) for i in client.registry.instances("web")}
    assert states == {"closed"}
    assert client.request("web", "GET", "/").status_code == 200
    assert all(client.inflight(i) == 0 for i in client.registry.instances("web"))


def test_a_streamed_response_stays_in_flight_until_its_body_is_read(registry, server):
    release = threading.Event()

    def answer(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", "10")
        handler.end_headers()
        handler.wfile.write(b"12345")
        handler.wfile.flush()
        release.wait(30)
        handler.wfile.write(b"67890")

    web = server(answer)
    instance = registry.register("web", "127.0.0.1", web.port)
    client = DiscoveryClient(listen=False)
    response = client.request("web", "GET", "/big", stream=True)
    assert client.inflight(instance) == 1  # the body is still coming: the instance is busy
    release.set()
    assert response.content == b"1234567890"
    assert client.inflight(instance) == 0
    # Closed without reading: out of flight too.
    release.clear()
    response = client.request("web", "GET", "/big", stream=True)
    assert client.inflight(instance) == 1
    release.set()
    response.close()
    assert client.inflight(instance) == 0


def test_a_streamed_body_that_breaks_counts_against_the_instance(registry, server):
    def answer(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", "100")
        handler.end_headers()
        handler.wfile.write(b"only part")
        handler.wfile.flush()
        handler.close_connection = True
        handler.connection.shutdown(2)

    web = server(answer)
    instance = registry.register("web", "127.0.0.1", web.port)
    client = DiscoveryClient(listen=False, breaker_failures=1)
    response = client.request("web", "GET", "/broken", stream=True)
    with pytest.raises(requests.RequestException):
        response.json()
    assert client.inflight(instance) == 0
    assert client.breakers.state(instance.instance_id) == "open"


def slow(handler):
    time.sleep(1.5)
    try:
        reply(handler)
    except OSError:
        pass


def test_a_read_timeout_is_retried_elsewhere_only_when_the_setting_allows(registry, server, settings):
    a, b = server(slow), server(slow)
    registry.register("web", "127.0.0.1", a.port)
    registry.register("web", "127.0.0.1", b.port)
    client = DiscoveryClient(listen=False)
    with pytest.raises(requests.ReadTimeout):
        client.request("web", "GET", "/", timeout=0.3)
    assert len(a.seen) + len(b.seen) == 2  # the default: a GET is resent once
    settings.DISCOVERY = {"RETRY_READ_TIMEOUTS": False}
    client = DiscoveryClient(listen=False)
    with pytest.raises(requests.ReadTimeout):
        client.request("web", "GET", "/", timeout=0.3)
    assert len(a.seen) + len(b.seen) == 3  # sent once: the instance may be working on it


def test_a_deadline_bounds_a_body_that_trickles_within_each_read_timeout(registry, server):
    finished = threading.Event()

    def trickle(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", "40")
        handler.end_headers()
        try:
            for _ in range(40):
                handler.wfile.write(b"x")
                handler.wfile.flush()
                time.sleep(0.1)
            finished.set()
        except OSError:
            pass

    web = server(trickle)
    instance = registry.register("web", "127.0.0.1", web.port)
    client = DiscoveryClient(listen=False, breaker_failures=1)
    with pytest.raises(DeadlineExceeded):
        client.request("web", "GET", "/", timeout=1.0, deadline=0.8)
    # Every read came within the 1 s timeout; the body takes 4 s; the deadline cut it short.
    assert not finished.is_set()
    assert isinstance(DeadlineExceeded("x"), requests.Timeout)
    assert len(web.seen) == 1  # no time left for a retry
    assert client.inflight(instance) == 0


def test_an_instance_registered_with_https_resolves_to_an_https_url(registry):
    registry.register("secure", "10.0.0.1", 8443, {"scheme": "https"})
    client = DiscoveryClient(listen=False)
    instance = client.resolve("secure")
    assert instance.scheme == "https" and client.resolve_url("secure") == "https://10.0.0.1:8443"
    with pytest.raises(ValueError):
        registry.register("secure", "10.0.0.1", 8443, {"scheme": "ftp"})
