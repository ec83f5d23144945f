"""The transactional outbox with real processes, on SQLite and on PostgreSQL (issue 17).

Writers are ``manage.py outbox_orders`` (tests/testapp/management/commands): one transaction per
order, an Order row and ``publish(..., outbox=True)``, some rolled back on purpose. The relay is
``manage.py runrelay`` as the docs say; the consumer is ``runconsumer outbox-orders:effects``,
guarded with ``idempotent="db"``, which writes one Effect row per order.
"""
import json
import re
import signal
import subprocess
import sys
from collections import defaultdict

import pytest

from tests.conftest import ROOT
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

STREAM = "outbox-orders"
FAST = {"OUTBOX_SWEEP_INTERVAL": 0.3, "PENDING_TIMEOUT_MS": 1000, "CLAIM_INTERVAL_MS": 200, "BLOCK_MS": 500}


@pytest.fixture
def run(run_consumer, process_database):
    def start(command, *args, server=None, env=None, streams=None):
        return run_consumer(*args, server=server, streams={**FAST, **(streams or {})}, command=command,
                            env={"DATABASE_URL": process_database.url, **(env or {})})
    return start


def manage(database, server, *args):
    """``manage.py ARGS`` to completion (a process of its own, like a web request); its output."""
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": database.url, "REDIS_URL": server.url,
           "SHOAL_TEST_STREAMS": json.dumps(FAST), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def write_orders(database, server, *orders, keys=0):
    manage(database, server, "outbox_orders", *orders, "--keys", str(keys))


def waiting_rows(database):
    return database.rows("SELECT count(*) FROM streams_app_outboxmessage WHERE relayed_at IS NULL")[0][0]


def effects(database):
    counts = defaultdict(int)
    for (name,) in database.rows("SELECT name FROM testapp_effect"):
        counts[name] += 1
    return dict(counts)


def stream_orders(redis):
    return [json.loads(fields["payload"]) for _, fields in redis.xrange(STREAM)]


def test_a_rolled_back_transaction_publishes_nothing_and_a_committed_one_is_relayed(
        redis_server, redis, run, process_database):
    relay = run("runrelay")
    relay.wait_for_output("relaying the outbox", timeout=60)
    write_orders(process_database, redis_server, "kept-1", "dropped-1:rollback", "kept-2", "dropped-2:rollback")
    # The committed rows were relayed and marked: the relay has run over everything there is.
    wait_for(lambda: redis.xlen(STREAM) == 2 and waiting_rows(process_database) == 0, timeout=60,
             what="both committed orders relayed")
    assert process_database.rows("SELECT name FROM testapp_order ORDER BY name") == [("kept-1",), ("kept-2",)]
    assert [o["order"] for o in stream_orders(redis)] == ["kept-1", "kept-2"]
    assert process_database.rows("SELECT count(*) FROM streams_app_outboxmessage")[0][0] == 2
    [(entry_id,)] = process_database.rows("SELECT entry_id FROM streams_app_outboxmessage WHERE key = 'kept-1'")
    assert entry_id == redis.xrange(STREAM)[0][0]

    consumer = run("runconsumer", f"{STREAM}:effects")
    wait_for(lambda: effects(process_database) == {"kept-1": 1, "kept-2": 1}, timeout=60, what="one effect per order")
    consumer.signal(signal.SIGTERM)
    relay.signal(signal.SIGTERM)
    assert relay.wait(60) == 0, relay.output()
    assert "stopped after relaying 2 rows" in relay.output()


def test_a_relay_killed_between_xadd_and_marking_resends_and_the_db_guard_makes_one_effect(
        redis_server, redis, run, process_database, tmp_path):
    names = [f"o{i}" for i in range(20)]
    # Three keys (k0, k1, k2) for twenty orders, as key=f"customer-{pk}" would: a key names no one message.
    write_orders(process_database, redis_server, *names, keys=3)
    marker = tmp_path / "died"
    doomed = run("runrelay", env={"SHOAL_TEST_RELAY_DIE_AFTER_XADD": str(marker)})
    assert doomed.wait(60) == -signal.SIGKILL, doomed.output()
    assert marker.read_text().strip() == "20"  # it had XADDed all 20 and marked none
    assert redis.xlen(STREAM) == 20 and waiting_rows(process_database) == 20

    relay = run("runrelay")
    wait_for(lambda: waiting_rows(process_database) == 0, timeout=60, what="the rows relayed again")
    assert redis.xlen(STREAM) == 40  # every message is in the stream twice: at-least-once

    consumer = run("runconsumer", f"{STREAM}:effects")
    wait_for(lambda: sum(effects(process_database).values()) >= 20, timeout=90, what="the effects")
    # Every entry handled (20 effects, 20 duplicates acked unseen) before counting: no stragglers.
    wait_for(lambda: (g := redis.xinfo_groups(STREAM)) and g[0]["lag"] == 0 and g[0]["pending"] == 0,
             timeout=90, what="all 40 entries acknowledged")
    assert effects(process_database) == {name: 1 for name in names}
    consumer.signal(signal.SIGTERM)
    relay.signal(signal.SIGTERM)


def test_with_redis_down_rows_accumulate_and_go_out_in_per_key_order_when_it_returns(
        redis_factory, run, process_database):
    server = redis_factory(persistent=True)
    # Two relays taking small batches: on PostgreSQL they share the backlog (SKIP LOCKED) and must
    # still keep each key's order; on SQLite the second stands by.
    relays = [run("runrelay", server=server, streams={"OUTBOX_BATCH": 3}) for _ in range(3)]
    for relay in relays:
        relay.wait_for_output("relaying the outbox", timeout=60)
    if process_database.kind == "sqlite":
        wait_for(lambda: any("one relay runs at a time" in r.output() for r in relays), timeout=60,
                 what="the second SQLite relay to say it stands by")
    server.stop()
    orders = [f"o{i}" for i in range(150)]
    write_orders(process_database, server, *orders, keys=3)
    assert waiting_rows(process_database) == 150  # accumulated: nothing could go out
    wait_for(lambda: any("Redis unreachable" in r.output() for r in relays), timeout=60, what="the outage logged")

    server.start()
    client = server.client()
    wait_for(lambda: waiting_rows(process_database) == 0, timeout=90, what="the backlog relayed")
    seen = defaultdict(list)
    for order in stream_orders(client):
        seen[order["order"]].append(order["seq"])
    by_key = defaultdict(list)
    for _, fields in client.xrange(STREAM):
        by_key[fields["key"]].append(json.loads(fields["payload"])["seq"])
    assert sorted(seen) == sorted(orders) and all(len(s) == 1 for s in seen.values())
    assert {key: seqs for key, seqs in by_key.items()} == {f"k{i}": list(range(50)) for i in range(3)}
    assert any("Redis reachable again" in r.output() for r in relays)
    for relay in relays:
        relay.signal(signal.SIGTERM)
        assert relay.wait(60) == 0, relay.output()


def test_runreclaimer_with_relay_relays_the_outbox_and_stops_cleanly(redis_server, redis, run, process_database):
    daemon = run("runreclaimer", "--relay", "--interval", "1")
    daemon.wait_for_output("Reclaimer: watching", timeout=60)
    write_orders(process_database, redis_server, "r-1", "r-2:rollback", "r-3")
    wait_for(lambda: redis.xlen(STREAM) == 2 and waiting_rows(process_database) == 0, timeout=60,
             what="the committed orders relayed by the reclaimer's relay")
    assert [o["order"] for o in stream_orders(redis)] == ["r-1", "r-3"]
    # It says what it relays, as runrelay does: a line when it starts, for passes with work, and at the end.
    daemon.wait_for_output("Relay: relayed", timeout=60)
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(60) == 0, daemon.output()
    output = daemon.output()
    assert "Relay: relaying the outbox of database 'default' to Redis (a thread of the reclaim daemon)" in output
    # Progress lines come at most once per sweep interval: a second row relayed within it is only counted
    # by the stop line when TERM arrives first.
    progress = re.findall(r"Relay: relayed (\d+) rows? to Redis", output)
    assert 1 <= len(progress) <= 2 and 1 <= sum(map(int, progress)) <= 2, output
    assert "Relay: stopped after relaying 2 rows" in output


def test_runreclaimer_once_with_relay_relays_what_is_waiting(redis_server, redis, run, process_database):
    """A cron job's ``runreclaimer --once --relay`` relays the outbox too, as ``runrelay --once`` would."""
    write_orders(process_database, redis_server, "c-1", "c-2")
    daemon = run("runreclaimer", "--once", "--relay")
    assert daemon.wait(90) == 0, daemon.output()
    assert [o["order"] for o in stream_orders(redis)] == ["c-1", "c-2"] and waiting_rows(process_database) == 0
    assert "Relay: stopped after relaying 2 rows" in daemon.output()


def test_a_value_the_database_refuses_is_a_publish_error_and_the_callers_transaction_goes_on(
        redis_server, process_database):
    """PostgreSQL refuses NUL in text: the outbox says so before any SQL, so the transaction stays usable."""
    script = "\n".join([
        "from django.db import transaction",
        "from streams_app import publish",
        "from streams_app.exceptions import PublishError",
        "from tests.testapp.models import Order",
        "with transaction.atomic():",
        "    Order.objects.create(name='before')",
        "    for stream, key in [('s', 'a\\x00b'), ('s\\x00', 'k'), ('s' * 201, 'k')]:",
        "        try:",
        "            publish(stream, {'n': 1}, key=key, outbox=True)",
        "        except PublishError as exc:",
        "            print('refused:', exc)",
        "    Order.objects.create(name='after')",
        "    publish('s', {'note': 'a\\x00b'}, key='fine', outbox=True)",
    ])
    output = manage(process_database, redis_server, "shell", "-c", script)
    assert output.count("refused:") == 3, output
    assert "key must not contain a NUL character" in output
    assert process_database.rows("SELECT name FROM testapp_order ORDER BY id") == [("before",), ("after",)]
    assert process_database.rows("SELECT stream, key FROM streams_app_outboxmessage") == [("s", "fine")]


def test_runrelay_says_what_is_wrong_with_its_database(run):
    unknown = run("runrelay", "--database", "nosuch")
    assert unknown.wait(60) == 3
    assert "no database 'nosuch' in DATABASES" in unknown.output()
