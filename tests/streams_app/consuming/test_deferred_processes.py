"""Deferred messages with real processes: ``runconsumer`` moves them when due, ``runreclaimer`` as a
backstop, and a SIGKILL of either at any point loses nothing and moves nothing twice."""
import json
import random
import signal
import time
from collections import Counter
from datetime import timedelta

import pytest

from streams_app import publish_many
from streams_app.partitioning import partitions
from streams_app.redis.keys import scheduled_data_key, scheduled_key
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.both_redis]


def runs(redis):
    return [json.loads(line) for line in redis.lrange("deferred:runs", 0, -1)]


def test_a_deferred_message_runs_after_its_time_and_soon_after_it(redis, run_consumer, settings):
    streams = {"PARTITIONS": {"deferred": 3}, "BLOCK_MS": 500}
    settings.STREAMS = {**settings.STREAMS, **streams}
    proc = run_consumer("deferred:g", streams=streams)
    proc.wait_for_output("started", timeout=60)
    keys = [f"k{n}" for n in range(60)]
    ids = []
    for n in range(0, 60, 10):  # six batches, due from 0.5 s to 3 s from now
        ids += publish_many("deferred", [{"n": i} for i in range(n, n + 10)], keys=keys[n : n + 10],
                            run_after=timedelta(milliseconds=500 + 500 * (n // 10)))
    wait_for(lambda: len(runs(redis)) >= 60, timeout=60, what="60 deferred messages handled")
    done = runs(redis)
    assert sorted(r["id"] for r in done) == sorted(ids), "a message was lost or ran twice"
    early = [r for r in done if r["at"] < r["due"]]
    assert not early, f"handled before its time: {early[:3]}"
    # Each ran from the partition its key routes to, as a direct publish of that key would.
    assert all(r["stream"] == partitions.route("deferred", r["key"]) for r in done)
    lateness = sorted(r["at"] - r["due"] for r in done)
    print(f"lateness ms: median {lateness[30]:.0f}, max {lateness[-1]:.0f}")  # bench/deferred.py measures it
    assert lateness[-1] < 10_000, lateness  # a deadline, not a speed: within a second or two when idle
    assert all(not redis.exists(scheduled_key(name)) for name in partitions.names("deferred"))
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0


@pytest.fixture
def sqlite_database(_databases):
    database = _databases("sqlite")
    database.empty()
    return database


def test_sigkills_of_whatever_moves_lose_nothing_and_move_nothing_twice(redis, run_consumer, sqlite_database):
    """Two runconsumers and a runreclaimer move 2000 messages due over six seconds, in batches of 5, while
    one of them after the other is SIGKILLed a random moment after it started moving, and started again.
    Each message must reach the stream exactly once, and with the db guard have exactly one effect."""
    streams = {"SCHEDULED_POLL_INTERVAL": 0.05, "SCHEDULED_BATCH": 5, "PENDING_TIMEOUT_MS": 2000,
               "CLAIM_INTERVAL_MS": 300, "CONSUMER_TTL": 2, "BLOCK_MS": 300}
    env = {"DATABASE_URL": sqlite_database.url}

    def start(kind):
        if kind == "reclaimer":
            return run_consumer("--interval", "0.05", command="runreclaimer", streams=streams, env=env)
        return run_consumer("deferreddb:d", "--threads", "4", streams=streams, env=env)

    kinds = ["consumer", "consumer", "reclaimer"]
    ready = {"consumer": "started", "reclaimer": "Reclaimer: watching"}
    procs = [start(kind) for kind in kinds]
    for proc, kind in zip(procs, kinds):
        proc.wait_for_output(ready[kind], timeout=60)
    count = 2000
    ids = []
    for n in range(0, count, 100):  # due from 1 s to 7 s from now, 100 at a time
        ids += publish_many("deferreddb", [{"n": i} for i in range(n, n + 100)], keys=[f"m{i}" for i in range(n, n + 100)],
                            run_after=timedelta(milliseconds=1000 + 6000 * n // count))
    rng = random.Random(29)
    kills = Counter()
    # Kill a process that is up (past its start line, so moving) a random moment after it got there,
    # until nothing is left to move: the kills land before, during and after its move script calls.
    while redis.zcard(scheduled_key("deferreddb")) and sum(kills.values()) < 60:
        up = [i for i, (proc, kind) in enumerate(zip(procs, kinds)) if ready[kind] in proc.output()]
        if not up:
            time.sleep(0.05)
            continue
        victim = rng.choice(up)
        time.sleep(rng.uniform(0.05, 0.4))
        procs[victim].kill()
        kills[kinds[victim]] += 1
        procs[victim] = start(kinds[victim])
    left_after_kills = redis.zcard(scheduled_key("deferreddb"))
    wait_for(lambda: redis.zcard(scheduled_key("deferreddb")) == 0, timeout=60, what="every message moved")
    entries = [fields for _, fields in redis.xrange("deferreddb")]
    per_id = Counter(fields["shoal:scheduled_id"] for fields in entries)
    assert set(per_id) == set(ids) and max(per_id.values()) == 1, "a message was lost or moved twice"
    assert not redis.exists(scheduled_data_key("deferreddb"))

    def effects():
        return Counter(name for (name,) in sqlite_database.rows("SELECT name FROM testapp_effect"))

    try:
        wait_for(lambda: sum(effects().values()) >= count and redis.xpending("deferreddb", "d")["pending"] == 0,
                 timeout=300, what="every message handled and acknowledged")
    except AssertionError as exc:
        missing = sorted(set(f"m{i}" for i in range(count)) - set(effects()))
        raise AssertionError(f"{exc}: {len(missing)} without an effect ({missing[:10]}), pending "
                             f"{redis.xpending('deferreddb', 'd')}; last output: "
                             f"{[proc.output()[-1500:] for proc in procs]}") from None
    assert effects() == Counter({f"m{i}": 1 for i in range(count)})
    early = [r for r in runs(redis) if r["at"] < r["due"]]
    assert not early, f"handled before its time: {early[:3]}"
    print(f"kills: {dict(kills)}; {count - left_after_kills} of {count} moved while the kills went on; "
          f"{len(runs(redis)) - count} handler runs repeated by takeover")
    assert kills["consumer"] >= 5 and kills["reclaimer"] >= 2, kills
    for proc in procs:
        proc.signal(signal.SIGTERM)
    assert [proc.wait(60) for proc in procs] == [0, 0, 0], [proc.output()[-2000:] for proc in procs]


def test_deferred_outbox_messages_commit_with_their_rows_and_run_once_when_due(redis, redis_server, run_consumer,
                                                                            sqlite_database):
    """Web-like writers (a process of their own) commit orders with deferred outbox publishes, some rolled
    back; runrelay schedules the committed ones, runconsumer moves and handles them when due."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    streams = {"OUTBOX_SWEEP_INTERVAL": 0.3, "BLOCK_MS": 500}
    env = {"DATABASE_URL": sqlite_database.url}
    relay = run_consumer(command="runrelay", streams=streams, env=env)
    consumer = run_consumer("outbox-orders:effects", streams=streams, env=env)
    consumer.wait_for_output("started", timeout=60)
    written = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "outbox_orders", "--count", "40", "--prefix", "o",
         "--rollback-every", "4", "--delay", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": sqlite_database.url,
             "REDIS_URL": redis_server.url, "PATH": "/usr/bin:/bin"})
    assert written.returncode == 0, written.stdout + written.stderr
    committed = {f"o{n}" for n in range(40) if n % 4 != 3}

    def effects():
        return Counter(name for (name,) in sqlite_database.rows("SELECT name FROM testapp_effect"))

    wait_for(lambda: set(effects()) >= committed, timeout=90, what="an effect for every committed order")
    entries = [(entry_id, fields) for entry_id, fields in redis.xrange("outbox-orders")]
    assert sorted(json.loads(fields["payload"])["order"] for _, fields in entries) == sorted(committed)
    early = [entry_id for entry_id, fields in entries if int(entry_id.split("-")[0]) < int(fields["shoal:run_after"])]
    assert not early, f"moved before their time: {early}"
    rows = sqlite_database.rows("SELECT entry_id, fields FROM streams_app_outboxmessage")
    assert sorted(entry_id for entry_id, _ in rows) == sorted(json.loads(f)["shoal:scheduled_id"] for _, f in rows)
    assert sorted(f["shoal:scheduled_id"] for _, f in entries) == sorted(entry_id for entry_id, _ in rows)
    assert effects() == Counter({name: 1 for name in committed})
    for proc in (relay, consumer):
        proc.signal(signal.SIGTERM)
    assert [relay.wait(60), consumer.wait(60)] == [0, 0]
