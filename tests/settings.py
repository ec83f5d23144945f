"""Settings for the test run and for the consumer processes tests start."""
import json
import os

# Never the Redis on 6379: anything a test forgets to point at its own server fails loudly.
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:1/0")
os.environ.setdefault("SECRET_KEY", "tests-only-not-secret")

from project.settings import *  # noqa: E402,F401,F403
from project.settings import INSTALLED_APPS, STREAMS  # noqa: E402

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]

# Consumer subprocesses get their STREAMS overrides (short timeouts) through the environment.
STREAMS = {**STREAMS, **json.loads(os.environ.get("SHOAL_TEST_STREAMS", "{}"))}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Tests that write a throw-away app (e.g. to change handler code under a running supervisor) add it here.
INSTALLED_APPS += json.loads(os.environ.get("SHOAL_TEST_APPS", "[]"))

# Test processes sharing one SQLite file (DATABASE_URL; tests/chaos puts its file in WAL mode) wait
# for the write lock instead of failing after 5 s, and take it at BEGIN, so a transaction that read
# first is never refused its upgrade (SQLITE_BUSY without waiting). synchronous=NORMAL loses nothing
# when a process is killed, only on power loss, which these tests do not simulate.
from project.settings import DATABASES  # noqa: E402

if DATABASES["default"]["ENGINE"].endswith("sqlite3") and os.environ.get("DATABASE_URL"):
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA synchronous=NORMAL",
    }
elif DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Without DATABASE_URL the test database is SQLite's in-memory one, used by this process alone: it
    # keeps Django's defaults, as before project/settings.py set its multi-process OPTIONS (WAL, IMMEDIATE).
    DATABASES["default"].pop("OPTIONS", None)

# A slow start-up on demand (tests/streams_app/supervisor/test_pid1.py): say so in a file, then wait,
# so that a test can send a signal while Django is still loading.
if os.environ.get("SHOAL_TEST_SLOW_START"):
    import time as _time

    with open(os.environ["SHOAL_TEST_SLOW_START"], "w") as _marker:
        _marker.write("loading settings")
    _time.sleep(3)
