"""A TCP proxy between Shoal's processes and a test's redis-server, for network faults on demand.

Modes (``NetProxy``): ``pass`` forwards; ``cut()`` closes every current connection (both sides see
it at once); ``delay(ms)`` holds each chunk ``ms`` before passing it on; ``blackhole()`` keeps every
connection, old and new, open but forwards nothing in either direction, and the connections it
caught stay dead after ``heal()``, as after a NAT or load-balancer drop (only new ones work again);
``refuse()`` closes the listener, so connects are refused until ``heal()`` opens it on the same port.
``stale_sends`` counts what clients sent, after a heal, on connections blackholed before it: a
connection that died in the fault and was used again (each such use costs a full socket timeout).

Threads, two per connection: a test's handful of clients needs nothing smarter.
"""
import socket
import threading
import time

from tests.redis_server import free_port

CHUNK = 65536


class _Link:
    """One client connection and its upstream connection, pumped both ways."""

    def __init__(self, proxy, client, upstream, dead):
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.dead = dead  # blackholed: read and dropped, forever
        self.dead_at = proxy.heals  # heals before it was blackholed
        self.closed = False
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                if self.dead:
                    if src is self.client and self.proxy.heals > self.dead_at:
                        self.proxy.stale_sends += 1
                        self.proxy.stale_samples.append(data[:120])  # what was sent: for failure messages
                    continue
                if self.proxy.delay_ms:
                    time.sleep(self.proxy.delay_ms / 1000)
                    if self.dead:
                        continue
                dst.sendall(data)
        except OSError:
            pass
        self.close()

    def close(self):
        if self.closed:
            return
        self.closed = True
        for sock in (self.client, self.upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self.proxy._forget(self)


class NetProxy:
    def __init__(self, target_port, target_host="127.0.0.1", port=None):
        self.target = (target_host, target_port)
        self.port = port or free_port()
        self.delay_ms = 0
        self.blackholed = False
        self.accepted = 0  # connections accepted so far (a test can wait for a reconnect)
        self.heals = 0
        self.stale_sends = 0  # chunks clients sent, after a heal, on connections blackholed before it
        self.stale_samples = []
        self._links = set()
        self._lock = threading.Lock()
        self._listener = None
        self._acceptor = None

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs):
        import redis
        return redis.Redis(port=self.port, **{"decode_responses": True, "socket_timeout": 10, **kwargs})

    @property
    def links(self):
        with self._lock:
            return len(self._links)

    # -- modes -------------------------------------------------------------------------------

    def start(self):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        listener.settimeout(0.1)
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._acceptor.start()
        return self

    def heal(self):
        """Back to ``pass`` for new connections; blackholed ones stay dead."""
        self.delay_ms = 0
        self.blackholed = False
        self.heals += 1
        if self._listener is None:
            self.start()

    def cut(self):
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()

    def delay(self, ms):
        self.delay_ms = ms

    def blackhole(self):
        self.blackholed = True
        with self._lock:
            for link in self._links:
                if not link.dead:
                    link.dead, link.dead_at = True, self.heals

    def refuse(self):
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            self._acceptor.join(timeout=5)

    def stop(self):
        self.refuse()
        self.cut()

    # -- plumbing ----------------------------------------------------------------------------

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                if self._listener is not listener:
                    return
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self.accepted += 1
                link = _Link(self, client, upstream, dead=self.blackholed)
                self._links.add(link)
                if link.closed:  # closed before it was added
                    self._links.discard(link)

    def _forget(self, link):
        with self._lock:
            self._links.discard(link)
