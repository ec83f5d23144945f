"""Private redis-server processes for tests: started on free ports, killed and restarted at will."""
import os
import shutil
import signal
import subprocess
import time

import redis

from tests.ports import free_port
from tests.waiting import wait_for

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


__all__ = ["REDIS_SERVER", "RedisServer", "free_port"]


class RedisServer:
    def __init__(self, directory, port=None, persistent=False):
        self.directory = directory
        self.port = port or free_port()
        self.persistent = persistent
        self.process = None

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs):
        return redis.Redis(port=self.port, **{"decode_responses": True, "socket_timeout": 10, **kwargs})

    def start(self):
        os.makedirs(self.directory, exist_ok=True)
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                "--save", "", "--daemonize", "no", "--logfile", "redis.log"]
        args += ["--appendonly", "yes", "--appendfsync", "everysec"] if self.persistent else ["--appendonly", "no"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        wait_for(lambda: self._pings(client), timeout=10, what=f"redis-server on port {self.port}")
        return self

    def _pings(self, client):
        if self.process.poll() is not None:
            raise RuntimeError(f"redis-server on port {self.port} exited with {self.process.returncode}")
        try:
            return client.ping()
        except (redis.ConnectionError, redis.BusyLoadingError):
            return False

    def stop(self, sig=signal.SIGKILL):
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=10)

    def restart(self, down_for=0.0):
        self.stop()
        if down_for:
            time.sleep(down_for)  # the outage itself is what is under test
        return self.start()
