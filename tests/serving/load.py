"""A bounded HTTP load loop for the reload tests and bench/http_bench.py.

Keep-alive clients reuse one connection; the others open one per request. A request on a reused
connection that the server closed before sending any byte of a response is retried once on a new
connection, as every HTTP client does for idempotent requests (RFC 9110 section 9.2.2); such retries
are counted apart. Anything else that is not a 200 is a failure.
"""
import http.client
import threading
import time
from dataclasses import dataclass, field

RETRYABLE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


@dataclass
class Result:
    started: float
    status: int | None
    body: str = ""
    error: str = ""
    finished: float = 0.0

    @property
    def seconds(self):
        return self.finished - self.started


@dataclass
class Load:
    port: int
    path: str
    clients: int = 4
    max_requests: int = 20_000
    results: list = field(default_factory=list)
    retries: int = 0

    def __post_init__(self):
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(i % 2 == 0,), daemon=True) for i in range(self.clients)]

    def start(self):
        for thread in self.threads:
            thread.start()
        return self

    def stop(self, timeout=30):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout)

    def count(self):
        return len(self.results)

    def failures(self):
        return [r for r in self.results if r.status != 200]

    def _record(self, result):
        result.finished = time.monotonic()
        with self.lock:
            self.results.append(result)
            if len(self.results) >= self.max_requests:
                self.stopping.set()

    def _client(self, keep_alive):
        conn = None
        while not self.stopping.is_set():
            started = time.monotonic()
            reused = conn is not None
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                result = self._request(conn, started)
            except RETRYABLE:
                conn.close()
                conn = None
                if not reused:
                    self._record(Result(started, None, error="connection closed on a new connection"))
                    continue
                with self.lock:
                    self.retries += 1
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                try:
                    result = self._request(conn, started)
                except OSError as exc:
                    result = Result(started, None, error=f"{type(exc).__name__}: {exc}")
            except OSError as exc:
                result = Result(started, None, error=f"{type(exc).__name__}: {exc}")
            self._record(result)
            if not keep_alive or result.status is None or conn.sock is None:
                conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def _request(self, conn, started):
        conn.request("GET", self.path)
        response = conn.getresponse()
        body = response.read().decode()
        if response.getheader("connection", "").lower() == "close":
            conn.close()
        return Result(started, response.status, body)
