import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.netproxy import NetProxy
from tests.redis_cluster import RedisClusterServer
from tests.redis_server import RedisServer
from tests.waiting import wait_for

# The fixtures Shoal ships for projects that use it (docs/testing.md): shoal_published, shoal_redis.
pytest_plugins = ["streams_app.testing.pytest_plugin"]

ROOT = Path(__file__).resolve().parent.parent


# Tests marked ``both_redis`` run twice: on one redis-server and on a local 3-master Redis Cluster.
REDIS_KINDS = ("single", "cluster")


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("both_redis") and "redis_kind" in metafunc.fixturenames:
        metafunc.parametrize("redis_kind", REDIS_KINDS)


@pytest.fixture(scope="session")
def single_redis_server(tmp_path_factory):
    """One private redis-server for the whole run. Tests that kill Redis use ``redis_factory``."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """One private Redis Cluster (3 masters, no replicas) for the run, started on first use (~2 s)."""
    cluster = RedisClusterServer(str(tmp_path_factory.mktemp("cluster"))).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_kind():
    """"single" unless the test is marked ``both_redis`` (then it runs once per kind)."""
    return "single"


@pytest.fixture
def redis_server(request, redis_kind):
    """The test's Redis: the single server, or the cluster for the ``cluster`` run of a both_redis test.

    Both have ``url``, ``port`` and ``client()``; Shoal finds out which one it talks to by itself.
    """
    return request.getfixturevalue("redis_cluster" if redis_kind == "cluster" else "single_redis_server")


@pytest.fixture
def redis_factory(tmp_path):
    servers = []

    def make(persistent=False):
        server = RedisServer(tmp_path / f"redis{len(servers)}", persistent=persistent).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def _point_django_at(settings, url):
    settings.CACHES = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": url},
    }


@pytest.fixture(autouse=True)
def _isolated_redis(request, settings):
    """Point Django at the private server, empty before and after each test."""
    if "redis_server" not in request.fixturenames and "redis" not in request.fixturenames:
        yield
        return
    server = request.getfixturevalue("redis_server")
    client = server.client()
    _flushall(server, client)
    _point_django_at(settings, server.url)
    yield
    _flushall(server, client)
    client.close()


def _flushall(server, client):
    if isinstance(server, RedisClusterServer):
        server.flushall(client)
    else:
        client.flushall()


@pytest.fixture
def net_proxy(single_redis_server):
    """A TCP proxy (tests/netproxy.py) in front of the single test server: ``.url`` for the processes
    under test, ``cut()``, ``delay(ms)``, ``blackhole()``, ``refuse()`` and ``heal()`` for the faults."""
    proxy = NetProxy(single_redis_server.port).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def redis(redis_server):
    """A decoded client on the test's (empty) Redis database."""
    return redis_server.client()


@pytest.fixture
def use_redis(settings):
    """Point Django at another server (one from ``redis_factory``)."""
    return lambda server: _point_django_at(settings, server.url)


class ConsumerProcess:
    """A ``manage.py`` subprocess whose output is collected as it comes."""

    def __init__(self, args, env, command="runconsumer", prefix=()):
        self.args = args
        self.lines = []
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, str(ROOT / "manage.py"), command, *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for_output(self, text, timeout=30):
        def seen():
            if text in "".join(self.lines):
                return True
            if self.proc.poll() is None:
                return False
            # It exited without the text (a boot that failed): say so with its output now. Waiting the
            # whole timeout for a dead process only said "never printed 'started' within 60 s".
            self._reader.join(timeout=5)
            if text in "".join(self.lines):
                return True
            raise AssertionError(f"{text!r} never came: the process exited with {self.proc.returncode}:\n"
                                 f"{self.output()}")

        wait_for(seen, timeout=timeout, what=f"{text!r} in the output")

    @property
    def pid(self):
        return self.proc.pid

    def signal(self, sig):
        self.proc.send_signal(sig)

    def kill(self):
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def wait(self, timeout=60):
        return self.proc.wait(timeout=timeout)

    def output(self):
        if self.proc.poll() is not None:
            self._reader.join(timeout=5)
        return "".join(self.lines)


@pytest.fixture
def run_consumer(redis_server):
    """Start ``manage.py runconsumer`` subprocesses against a test Redis; stop them at teardown."""
    procs = []

    def start(*args, server=None, streams=None, env=None, command="runconsumer", prefix=()):
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "REDIS_URL": (server or redis_server).url,
            "SHOAL_TEST_STREAMS": json.dumps(streams or {}),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        proc = ConsumerProcess([*args, "-v", "2"], full_env, command=command, prefix=prefix)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.proc.poll() is None:
            proc.kill()


# -- databases that subprocesses reach (tests/databases.py) ------------------------------------

@pytest.fixture(scope="session")
def _databases(tmp_path_factory):
    """One migrated database per engine for the whole run, made when a test first asks; dropped at the end."""
    from tests.databases import PostgresDatabase, PostgresUnavailable, SqliteDatabase

    made, refused = {}, {}

    def get(kind):
        if kind in refused:
            pytest.skip(refused[kind])
        if kind not in made:
            try:
                made[kind] = (SqliteDatabase(tmp_path_factory.mktemp("db") / "shoal.sqlite3") if kind == "sqlite"
                              else PostgresDatabase()).create()
            except PostgresUnavailable as exc:
                refused[kind] = f"PostgreSQL tests skipped: {exc}"
                pytest.skip(refused[kind])
        return made[kind]

    yield get
    for database in made.values():
        database.drop()


@pytest.fixture(params=["sqlite", "postgres"])
def process_database(request, _databases):
    """A migrated database for real processes, on SQLite and on PostgreSQL (one test each), its
    application tables empty. ``.url`` goes in DATABASE_URL; ``.rows(sql)`` reads it back."""
    database = _databases(request.param)
    database.empty()
    return database


@pytest.fixture
def postgres_database(_databases):
    """The PostgreSQL database alone, for what only PostgreSQL shows (NUL characters, strict text)."""
    database = _databases("postgres")
    database.empty()
    return database
