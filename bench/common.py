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


def time_consumption(client, stream, group, total, timeout=600):
    """Seconds from the first entry read by ``group`` to the last one acked, polled every 2 ms."""
    deadline = time.monotonic() + timeout
    start = None
    while time.monotonic() < deadline:
        read, pending = group_progress(client, stream, group)
        now = time.monotonic()
        if start is None and read > 0:
            start = now
        if read >= total and pending == 0:
            return now - start
        time.sleep(0.002)
    raise TimeoutError(f"{group} did not consume {total} entries in {timeout}s")
