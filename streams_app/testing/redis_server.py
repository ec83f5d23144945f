"""A private redis-server for a project's integration tests (the ``shoal_redis`` pytest fixture).

Started on a free port of 127.0.0.1 with no persistence, in a directory of its own, and killed at the
end of the test session. ``SHOAL_TEST_REDIS_URL`` names a Redis to use instead (a CI service): it must be a
database the tests own, since each test begins and ends with FLUSHDB.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

URL_VARIABLE = "SHOAL_TEST_REDIS_URL"
START_TIMEOUT = 10.0  # seconds for a fresh redis-server to answer PING


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class TestRedis:
    """A Redis for tests: ``url``; ``start()`` runs the private server unless ``SHOAL_TEST_REDIS_URL`` names one."""

    __test__ = False  # not a test class, whatever pytest's name rules say

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None
        self.url = os.environ.get(URL_VARIABLE, "")

    def start(self) -> TestRedis:
        if self.url:
            return self
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError(f"redis-server is not on PATH: install Redis, or set {URL_VARIABLE} to a "
                                    "Redis database the tests may flush")
        port = _free_port()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.directory), "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--logfile", "redis.log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + START_TIMEOUT
        client = self.client()
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}; see {self.directory}/redis.log")
            try:
                client.ping()
                return self
            except (redis.ConnectionError, redis.BusyLoadingError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)  # polling PING until the deadline: a fresh server answers within milliseconds

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=10)

    def flush(self) -> None:
        with self.client() as client:
            client.flushdb()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
