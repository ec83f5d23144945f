"""Helpers shared by the benchmarks: a private redis-server and Django set up against it."""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.redis_server import RedisServer  # noqa: E402


def at_least(minimum, why=""):
    """argparse type of a whole number of at least ``minimum``; ``why`` says what the floor is for."""
    import argparse

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is too small: give {minimum} or more{why}")
        return value

    return parse


positive = at_least(1)  # messages, runs, workers, batch sizes


def start_redis():
    """A throw-away redis-server on a free port, so benchmarks never touch a real one."""
    return RedisServer(Path(tempfile.mkdtemp(prefix="shoal-bench-"))).start()


def setup_django(redis_url, settings="tests.settings"):
    os.environ["REDIS_URL"] = redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings)
    import django

    django.setup()


def manage(*args, redis_url, env=None, **popen):
    full_env = {**os.environ, "REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "tests.settings", **(env or {})}
    return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=full_env, **popen)


def group_progress(client, stream, group):
    for info in client.xinfo_groups(stream):
        if info["name"] == group:
            return info["entries-read"] or 0, info["pending"]
    return 0, 0


def cpu_seconds(pid):
    """User + system CPU seconds so far of our own child process ``pid`` (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_consumption(client, stream, group, total, timeout=600, pid=None):
    """Seconds from the first entry read by ``group`` to the last one acked, polled every 2 ms.

    With ``pid`` (the consuming process), returns (seconds, CPU seconds that process spent meanwhile):
    on a loaded machine the CPU time per message says more than the wall-clock rate.
    """
    deadline = time.monotonic() + timeout
    start = cpu_start = None
    while time.monotonic() < deadline:
        read, pending = group_progress(client, stream, group)
        now = time.monotonic()
        if start is None and read > 0:
            start = now
            cpu_start = cpu_seconds(pid) if pid else None
        if read >= total and pending == 0:
            if pid:
                return now - start, cpu_seconds(pid) - cpu_start
            return now - start
        time.sleep(0.002)
    raise TimeoutError(f"{group} did not consume {total} entries in {timeout}s")
