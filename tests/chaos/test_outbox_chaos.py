"""The outbox's chaos run, on PostgreSQL (issue 17).

Web-like writers (three ``manage.py outbox_orders`` processes) commit Order rows with an outbox
publish in the same transaction, every 10th transaction rolled back on purpose, the orders sharing
40 keys. Two ``runrelay``
processes share the outbox (SKIP LOCKED) while one of them is SIGKILLed every second or so and
started again, and redis-server is restarted once (SIGTERM: a clean shutdown keeps every write it
acknowledged). One ``runconsumer outbox-orders:effects`` (``idempotent="db"``) writes an Effect row
per message, and is SIGKILLed once too.

At the end, counted: every committed order has exactly one Effect row; no rolled-back order has any;
the outbox is empty of waiting rows. Relays killed between their XADDs and their commit re-send rows,
so the stream may hold a key twice: the db guard must still make one effect.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from tests.conftest import ROOT, ConsumerProcess
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

WRITERS, ORDERS_EACH, ROLLBACK_EVERY = 3, 600, 10
KEYS = 40  # orders share keys (k0..k39, across writers), as key=f"customer-{pk}" would: each still has its effect
STREAMS = {"OUTBOX_SWEEP_INTERVAL": 0.5, "OUTBOX_BATCH": 50, "PENDING_TIMEOUT_MS": 2000, "CLAIM_INTERVAL_MS": 300,
           "BLOCK_MS": 500, "CONSUMER_TTL": 3.0}


def test_outbox_orders_have_exactly_one_effect_through_relay_kills_and_a_redis_restart(
        redis_factory, postgres_database, tmp_path):
    seed = int(os.environ.get("SHOAL_CHAOS_SEED") or random.SystemRandom().randrange(1, 2**31))
    print(f"outbox chaos seed {seed}: rerun with SHOAL_CHAOS_SEED={seed}", flush=True)
    rng = random.Random(seed)
    server = redis_factory(persistent=True)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": server.url,
           "DATABASE_URL": postgres_database.url, "SHOAL_TEST_STREAMS": json.dumps(STREAMS), "PYTHONUNBUFFERED": "1"}
    processes = []

    def start(command, *args, extra_env=None):
        processes.append(ConsumerProcess([*args, "-v", "2"], {**env, **(extra_env or {})}, command=command))
        return processes[-1]

    def start_relay():
        # Half the relays die of SIGKILL right after their first XADD batch, before marking it (the
        # fault tests/testapp/apps.py injects): the window a timed kill almost never hits.
        if rng.random() < 0.5:
            return start("runrelay", extra_env={"SHOAL_TEST_RELAY_DIE_AFTER_XADD": str(tmp_path / f"died-{len(processes)}")})
        return start("runrelay")

    try:
        relays = [start_relay(), start_relay()]
        consumer = start("runconsumer", "outbox-orders:effects", "--threads", "2")
        consumer.wait_for_output("started", timeout=60)
        writers = [subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "outbox_orders", "--count", str(ORDERS_EACH),
                                     "--prefix", f"w{w}-", "--rollback-every", str(ROLLBACK_EVERY), "--keys", str(KEYS)],
                                    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for w in range(WRITERS)]
        faults = Counter()
        redis_restart_at = time.monotonic() + rng.uniform(2, 5)
        consumer_kill_at = time.monotonic() + rng.uniform(1, 6)

        def relay_faults():
            return faults["relay SIGKILL"] + faults["relay died after XADD"]

        # Fault until the writers are done AND the schedule has run: on a quiet machine the writers can
        # finish before the Redis restart was due (what is left in the outbox then meets the faults).
        while any(w.poll() is None for w in writers) or redis_restart_at or consumer_kill_at or relay_faults() < 3:
            time.sleep(rng.uniform(0.5, 2.0))
            victim = rng.randrange(len(relays))
            if relays[victim].proc.poll() is None:
                if "relaying the outbox" not in relays[victim].output():
                    continue  # still starting: a kill now would test nothing
                relays[victim].kill()
                faults["relay SIGKILL"] += 1
            else:
                faults["relay died after XADD"] += 1
            relays[victim] = start_relay()
            if redis_restart_at and time.monotonic() > redis_restart_at:
                server.stop(signal.SIGTERM)
                time.sleep(rng.uniform(1, 3))
                server.start()
                redis_restart_at = None
                faults["redis restart"] += 1
            if consumer_kill_at and time.monotonic() > consumer_kill_at:
                consumer.kill()
                consumer = start("runconsumer", "outbox-orders:effects", "--threads", "2")
                consumer_kill_at = None
                faults["consumer SIGKILL"] += 1
        for writer in writers:
            assert writer.wait(60) == 0, writer.stdout.read()
        print(f"faults: {dict(faults)}", flush=True)
        # The relays left may both carry the die-after-first-batch fault: one healthy relay drains the rest.
        start("runrelay")

        def waiting():
            return postgres_database.rows("SELECT count(*) FROM streams_app_outboxmessage WHERE relayed_at IS NULL")[0][0]

        wait_for(lambda: waiting() == 0, timeout=180, what="the outbox drained")
        client = server.client()

        def settled():
            groups = client.xinfo_groups("outbox-orders")
            return groups and groups[0]["lag"] == 0 and groups[0]["pending"] == 0

        wait_for(settled, timeout=180, what="every entry acknowledged by the effects group")
        committed = {name for (name,) in postgres_database.rows("SELECT name FROM testapp_order")}
        effects = Counter(name for (name,) in postgres_database.rows("SELECT name FROM testapp_effect"))
        expected = {f"w{w}-{n}" for w in range(WRITERS) for n in range(ORDERS_EACH) if n % ROLLBACK_EVERY != ROLLBACK_EVERY - 1}
        assert committed == expected
        twice = {name: count for name, count in effects.items() if count != 1}
        assert not twice, f"orders with more than one effect: {sorted(twice)[:10]}"
        assert set(effects) == committed, (f"missing effects: {sorted(committed - set(effects))[:10]}; "
                                           f"effects of rolled-back orders: {sorted(set(effects) - committed)[:10]}")
        entries = client.xlen("outbox-orders")
        if faults["relay died after XADD"]:
            assert entries > len(committed)  # the dead relays' batches went out twice: the guard was tested
        print(f"{len(committed)} committed orders, {entries} stream entries ({entries - len(committed)} re-sent), "
              f"{sum(effects.values())} effects", flush=True)
        for process in processes:
            if process.proc.poll() is None:
                process.signal(signal.SIGTERM)
        for process in processes:
            process.wait(60)
    finally:
        for process in processes:
            if process.proc.poll() is None:
                process.kill()
