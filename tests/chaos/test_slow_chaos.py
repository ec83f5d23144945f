"""The slow chaos run: handlers slower than the pending timeout, fast-then-slow traffic, a worker
frozen (SIGSTOP) past the pending timeout, CLIENT KILL of every connection, and Redis at maxmemory
for a while; then strict counting (issue 13).

Three groups read ``slowchaos`` (tests/testapp/consumers.py), two plain ``runconsumer`` processes
each, on a private redis-server, with a ``runreclaimer``. Pending timeout 1.5 s; a tenth of the slow
entries take 2 s, longer than that, and after 1,500 fast entries the slow ones arrive in bursts
that one worker's reads take in whole. What must hold (README "Guarantees by group kind"):

- ``db`` (idempotent="db"): exactly one Effect row per key;
- every group: every key handled, and no entry in the dead-letter stream (handlers here never fail
  for good, so an entry there was judged abandoned while alive: "both handled and dead-lettered");
- ``redis`` and ``plain``: duplicates are printed, not asserted: the frozen worker's entries are
  taken over, as the README says, and when it thaws it finishes what it was running.

Bounded: about a minute on the 2-core machine.
"""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter

import pytest
import redis as redis_py

from streams_app.redis import keys as keys_module
from streams_app.publishing.encoding import encode_message
from tests.conftest import ROOT, ConsumerProcess
from tests.testapp.consumers import SLOW_CHAOS_STREAM
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

GROUPS = ("db", "redis", "plain")
FAST, SLOW = 1500, 120
STREAMS = {
    "PENDING_TIMEOUT_MS": 1500,
    "CLAIM_INTERVAL_MS": 200,
    "BLOCK_MS": 500,
    "CONSUMER_TTL": 2,
    "RECLAIM_INTERVAL": 0.5,
    "SHUTDOWN_TIMEOUT": 10,
}


@pytest.fixture
def database(tmp_path):
    path = tmp_path / "slowchaos.sqlite3"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": f"sqlite:///{path}"}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    return path


def publish(client, messages):
    """XADD in batches, retrying what Redis refused (maxmemory) or dropped (CLIENT KILL)."""
    for start in range(0, len(messages), 100):
        batch = messages[start : start + 100]
        while True:
            try:
                pipe = client.pipeline(transaction=True)  # all or nothing: no key stored twice
                for fields in batch:
                    pipe.xadd(SLOW_CHAOS_STREAM, fields)
                pipe.execute()
                break
            except (redis_py.ConnectionError, redis_py.TimeoutError, redis_py.ResponseError):
                time.sleep(0.1)


@pytest.mark.timeout(400)
def test_slow_handlers_hoarding_freezes_and_a_full_redis(redis_factory, database):
    server = redis_factory(persistent=True)
    client = server.client()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": server.url,
           "DATABASE_URL": f"sqlite:///{database}", "SHOAL_TEST_STREAMS": json.dumps(STREAMS), "PYTHONUNBUFFERED": "1"}
    workers = {g: [ConsumerProcess([f"{SLOW_CHAOS_STREAM}:{g}", "--threads", "2", "-v", "1"], env) for _ in range(2)]
               for g in GROUPS}
    reclaimer = ConsumerProcess(["--interval", "0.5", "-v", "1"], env, command="runreclaimer")
    procs = [p for ps in workers.values() for p in ps] + [reclaimer]
    keys = [f"s{n:05d}" for n in range(FAST + SLOW)]
    log = []
    try:
        for proc in procs[:-1]:
            proc.wait_for_output("started (", timeout=60)
        # Fast traffic first (read sizes grow), then slow entries: 0.3 s each, every tenth 2 s.
        fast = [encode_message({"n": n}, key=k) for n, k in enumerate(keys[:FAST])]
        slow = [encode_message({"n": n, "sleep": 2.0 if n % 10 == 0 else 0.3}, key=k)
                for n, k in enumerate(keys[FAST:], FAST)]
        publish(client, fast)
        publish(client, slow[: SLOW // 2])
        time.sleep(1.0)
        frozen = workers["db"][0]
        os.kill(frozen.pid, signal.SIGSTOP)  # past the pending timeout: its entries are taken over
        log.append(f"SIGSTOP {frozen.pid}")
        time.sleep(3.0)
        os.kill(frozen.pid, signal.SIGCONT)
        log.append(f"SIGCONT {frozen.pid}")
        publish(client, slow[SLOW // 2 :])
        killed = client.client_kill_filter(_type="normal", skipme=True)
        log.append(f"CLIENT KILL TYPE normal: {killed} connections")
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
        time.sleep(3.0)  # Redis refuses writes meanwhile: consumers go on reading and acking
        client.config_set("maxmemory", "0")
        log.append("maxmemory for 3 s")
        print("faults: " + "; ".join(log), flush=True)

        def effects():
            with sqlite3.connect(database, timeout=30) as db:
                return Counter(dict(db.execute("SELECT name, COUNT(*) FROM testapp_effect GROUP BY name").fetchall()))

        def settled():
            for proc in procs:
                assert proc.proc.poll() is None, f"{' '.join(proc.args)} exited {proc.proc.returncode}:\n{proc.output()[-3000:]}"
            return (len(effects()) == len(keys) and client.hlen("slowchaos:redis:handled") == len(keys)
                    and client.hlen("slowchaos:plain:handled") == len(keys)
                    and all(g["pending"] == 0 and g["lag"] == 0 for g in client.xinfo_groups(SLOW_CHAOS_STREAM)))

        wait_for(settled, timeout=240, interval=0.5, what="every key handled by every group, nothing pending")
        for proc in procs:
            proc.signal(signal.SIGTERM)
        exits = [proc.wait(60) for proc in procs]
        assert exits == [0] * len(procs), [p.output()[-3000:] for p in procs]

        rows = effects()
        assert set(rows) == set(keys) and max(rows.values()) == 1, {k: n for k, n in rows.items() if n != 1}
        dead = client.xrange(keys_module.dead_letter_key(SLOW_CHAOS_STREAM))
        assert dead == [], f"entries dead-lettered although their handlers all succeeded: {dead[:3]}"
        redis_twice = {k: n for k, n in client.hgetall("slowchaos:redis:handled").items() if int(n) > 1}
        plain_twice = {k: n for k, n in client.hgetall("slowchaos:plain:handled").items() if int(n) > 1}
        output = "".join(p.output() for p in procs)
        print(f"slow chaos: {len(keys)} keys; db effects exactly once; duplicates redis={len(redis_twice)} "
              f"plain={len(plain_twice)}; {output.count('took over')} takeover lines; "
              f"{output.count('Redis is at maxmemory')} maxmemory warnings", flush=True)
    except BaseException:
        for proc in procs:
            print(f"--- {' '.join(proc.args)} (pid {proc.pid})\n{proc.output()[-3000:]}", flush=True)
        raise
    finally:
        for proc in procs:
            if proc.proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                proc.kill()
