"""Failure handling with real processes: workers that die mid-handler or between commit and ack,
and reclaim daemons racing each other."""
import json
import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.both_redis]


@pytest.fixture(scope="session")
def database_url(tmp_path_factory):
    """A migrated SQLite file: pytest-django's in-memory test database is invisible to subprocesses."""
    path = tmp_path_factory.mktemp("db") / "shoal.sqlite3"
    url = f"sqlite:///{path}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    return url, path


@pytest.fixture
def run_command(run_consumer, database_url):
    """``manage.py <command>`` against the test Redis and the migrated SQLite file."""
    return lambda command, *args, streams=None: run_consumer(
        *args, streams=streams, env={"DATABASE_URL": database_url[0]}, command=command)


FAST = {"PENDING_TIMEOUT_MS": 400, "CLAIM_INTERVAL_MS": 100, "RETRY_BACKOFF": 0.1}


def test_handler_that_kills_its_worker_is_dead_lettered_by_the_daemon_at_the_limit(redis, run_command):
    entry = redis.xadd("suicide", {"payload": json.dumps({"n": 1})})
    # max_deliveries=3: each worker takes it over and dies with it. The first death, on a first read, is
    # charged to nobody (only a run alone in its process is: docs/failures.md); each later run is a
    # suspect's, alone, and its death is charged: the count is the charged runs + 1.
    for run, count in ((1, 1), (2, 1), (3, 2), (4, 3)):
        worker = run_command("runconsumer", "suicide:g", streams=FAST)
        assert worker.wait(60) == -signal.SIGKILL, worker.output()
        assert redis.llen("started:suicide:g") == run
        [row] = redis.xpending_range("suicide", "g", "-", "+", 10)
        assert row["times_delivered"] == count
    wait_for(lambda: redis.xpending_range("suicide", "g", "-", "+", 1, idle=FAST["PENDING_TIMEOUT_MS"]),
             timeout=10, what="the entry idle past the pending timeout")
    daemon = run_command("runreclaimer", "--once", streams=FAST)
    assert daemon.wait(60) == 0, daemon.output()
    [(_, fields)] = redis.xrange("{suicide}:dlq")
    assert fields["shoal:origin_id"] == entry and fields["shoal:deliveries"] == "3"
    assert "no handler error recorded" in fields["shoal:error"]
    assert redis.xpending("suicide", "g")["pending"] == 0
    assert redis.llen("started:suicide:g") == 4  # max_deliveries + 1 runs, never a fifth


def test_two_reclaim_daemons_racing_dead_letter_each_entry_exactly_once(redis, run_command):
    pipe = redis.pipeline(transaction=False)
    for n in range(1000):
        pipe.xadd("jobs", {"payload": json.dumps({"n": n})})
    ids = pipe.execute()
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "ghost", {"jobs": ">"})
    daemons = [run_command("runreclaimer", "--interval", "0.02") for _ in range(2)]
    for daemon in daemons:
        daemon.wait_for_output("Reclaimer: watching")
    # All 1000 go over the limit at one instant (MULTI), while both daemons are polling.
    pipe = redis.pipeline(transaction=True)
    for start in range(0, 1000, 250):
        pipe.xclaim("jobs", "a", "ghost", 0, ids[start : start + 250], idle=60_000, retrycount=5, justid=True)
    pipe.execute()
    wait_for(lambda: redis.xpending("jobs", "a")["pending"] == 0, timeout=60, what="nothing pending")
    for daemon in daemons:
        daemon.signal(signal.SIGTERM)
    assert [d.wait(30) for d in daemons] == [0, 0], [d.output() for d in daemons]
    origins = [f["shoal:origin_id"] for _, f in redis.xrange("{jobs}:dlq")]
    assert len(origins) == 1000 and set(origins) == set(ids)
    assert all("stopped after" in d.output() for d in daemons)


def test_db_idempotent_handler_killed_after_commit_before_ack_has_its_effect_once(redis, run_command, database_url):
    _, path = database_url
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM testapp_effect")
        db.execute("DELETE FROM streams_app_processedmessage")
    entry = redis.xadd("dbjobs", {"payload": json.dumps({"name": "charge-42", "die_after_commit": True}), "key": "charge-42"})
    first = run_command("runconsumer", "dbjobs:d", "--threads", "1", streams=FAST)
    assert first.wait(60) == -signal.SIGKILL, first.output()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT name, entry_id FROM testapp_effect").fetchall() == [("charge-42", entry)]
    [row] = redis.xpending_range("dbjobs", "d", "-", "+", 10)
    assert row["message_id"] == entry  # committed, never acked
    second = run_command("runconsumer", "dbjobs:d", "--threads", "1", streams=FAST)
    wait_for(lambda: redis.xpending("dbjobs", "d")["pending"] == 0, timeout=30, what="the redelivery acked")
    second.wait_for_output("is a duplicate; acked without running the handler")
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM testapp_effect").fetchone() == (1,)
        assert db.execute("SELECT stream, \"group\", key FROM streams_app_processedmessage").fetchall() == [
            ("dbjobs", "d", "charge-42")]
    assert redis.llen("started:dbjobs:d") == 1  # the handler never ran for the redelivery
    assert redis.xlen("{dbjobs}:dlq") == 0
    second.signal(signal.SIGTERM)
    assert second.wait(30) == 0
