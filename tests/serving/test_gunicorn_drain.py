"""SIGTERM to a real gunicorn master: while its workers drain, a new connection is refused at once (so a
client retries elsewhere), never accepted into a listening socket nobody reads and reset seconds later.

gthread keeps a stopping worker's kept-alive connections open for up to 2 s (STOP_KEEPALIVE_LINGER), and
it used to keep its listening socket open as long: the kernel completed the handshakes of new connections
into the accept queue, and closing the socket at the end of the drain reset them all.
"""
import errno
import signal
import socket
import threading
import time

import pytest

from discovery_app.client import DiscoveryClient
from discovery_app.registry import ServiceRegistry
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


def one_request(port, timeout=10.0):
    """'ok' (answered), 'refused' (connection refused: nothing was sent) or what went wrong."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return f"connect: {type(exc).__name__}: {exc}"
    started = time.monotonic()
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
        if reply.startswith(b"HTTP/1.1 200"):
            return "ok"
        return f"answered {reply[:40]!r}"
    except OSError as exc:
        return f"{errno.errorcode.get(exc.errno, type(exc).__name__)} after {time.monotonic() - started:.1f} s"
    finally:
        sock.close()


def test_new_connections_during_the_drain_are_refused_not_reset(gunicorn, redis):
    server = gunicorn(workers=1)
    # A kept-alive connection: the stopping worker lingers for it (up to 2 s) before it exits.
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert idle.recv(4096).startswith(b"HTTP/1.1 200")
    try:
        server.signal(signal.SIGTERM)
        wait_for(lambda: "Handling signal: term" in server.output(), timeout=10, what="the master handling TERM")
        outcomes = []
        threads = []
        for _ in range(8):  # during the drain: the worker lingers for the idle connection meanwhile
            thread = threading.Thread(target=lambda: outcomes.append(one_request(server.port)))
            thread.start()
            threads.append(thread)
            time.sleep(0.1)
        for thread in threads:
            thread.join(30)
    finally:
        idle.close()
    assert server.proc.wait(60) == 0
    assert len(outcomes) == 8
    assert [o for o in outcomes if o not in ("ok", "refused")] == [], outcomes
    assert "refused" in outcomes, outcomes  # the drain really was under way


def test_posts_through_discovery_fail_none_when_an_instance_is_stopped_under_load(gunicorn, redis, settings):
    # The second reproduction: 5 failed POSTs in 3 of 7 rounds through DiscoveryClient, although
    # the instance had deregistered. A refused connection sent nothing, so even a POST goes elsewhere.
    env = {"WEB_SERVICE_NAME": "shoal-web-drain"}
    first, second = gunicorn(workers=2, env=env), gunicorn(workers=2, env=env)
    registry = ServiceRegistry()
    wait_for(lambda: len(registry.instances("shoal-web-drain")) == 2, timeout=60, what="both instances registered")
    client = DiscoveryClient(strategy="round-robin")
    assert client.wait_listening(timeout=10)
    stopping = threading.Event()
    results = []

    def caller():
        while not stopping.is_set():
            try:
                response = client.request("shoal-web-drain", "POST", "/healthz", timeout=10)
                results.append((time.monotonic(), response.url, response.status_code))
            except Exception as exc:  # noqa: BLE001 - what the test counts
                results.append((time.monotonic(), None, f"{type(exc).__name__}: {exc}"))

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(results) >= 300, timeout=60, what="300 calls before the stop")
        first.signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        assert first.proc.wait(60) == 0
        wait_for(lambda: sum(t > stopped_at + 2.5 for t, _, _ in results) >= 100, timeout=60,
                 what="100 calls after the drain's linger")
    finally:
        stopping.set()
        for thread in threads:
            thread.join(30)
        client.close()
    failed = [r for r in results if r[2] != 200]
    assert failed == [], f"{len(failed)} of {len(results)} calls failed, e.g. {failed[:3]}"
    first_url = f"http://127.0.0.1:{first.port}"
    assert any(url and url.startswith(first_url) for t, url, _ in results if t < stopped_at)  # it took calls
    assert second.proc.poll() is None
