"""Consumers through a TCP proxy (tests/netproxy.py) that blackholes every connection for longer than
the socket timeout, as a NAT or load-balancer drop does: after the heal, every process reads again
within the documented bound (docs/consuming.md "Network faults"), with the default settings, and an
idempotent="db" group loses nothing and runs nothing twice.
"""
import json
import re
import signal
import time

import pytest

from streams_app.consuming.liveness import reader_client_name
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

RECOVERY_BOUND = 15  # seconds after the heal (docs/consuming.md)
FAULT = 40  # seconds: longer than the 30 s socket timeout of the shared pool


@pytest.fixture
def database(_databases):
    database = _databases("sqlite")
    database.empty()
    return database


def _publish(redis, names):
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.xadd("dbjobs", {"payload": json.dumps({"name": name}), "key": name})
    return pipe.execute()


def _effects(database):
    return [name for (name,) in database.rows("SELECT name FROM testapp_effect")]


def _consumer_names(proc, count):
    names = re.findall(r"Consumer (\S+): started", proc.output())
    return names if len(names) >= count else None


def _reading(redis, names):
    """Every consumer in ``names`` has a reader connection blocked in, or just back from, XREADGROUP
    (a blackholed connection stays open on the server side, its idle time growing)."""
    readers = {c["name"] for c in redis.client_list() if c["cmd"] == "xreadgroup" and int(c["idle"]) <= 2}
    return all(reader_client_name(name) in readers for name in names)


@pytest.mark.parametrize("workers", [None, 2], ids=["single", "workers2"])
def test_consumers_read_again_soon_after_a_blackhole_longer_than_the_socket_timeout(
        redis, net_proxy, run_consumer, database, workers):
    args = ["dbjobs:d", *(["--workers", str(workers)] if workers else [])]
    proc = run_consumer(*args, server=net_proxy, env={"DATABASE_URL": database.url})
    before = [f"before-{n}" for n in range(20)]
    _publish(redis, before)
    wait_for(lambda: len(_effects(database)) == 20, timeout=60, what="the first messages handled")
    consumers = wait_for(lambda: _consumer_names(proc, workers or 1), timeout=30, what="every worker started")
    wait_for(lambda: _reading(redis, consumers), timeout=30, what="every worker reading")

    net_proxy.blackhole()
    time.sleep(FAULT)  # the fault itself is what is under test
    net_proxy.heal()
    healed = time.monotonic()

    during = [f"after-{n}" for n in range(20)]
    _publish(redis, during)
    try:
        wait_for(lambda: _reading(redis, consumers), timeout=RECOVERY_BOUND,
                 what=f"every consumer ({consumers}) reading again within {RECOVERY_BOUND} s of the heal")
    except AssertionError:
        print(proc.output()[-4000:], [(c["name"], c["cmd"], c["idle"]) for c in redis.client_list()])
        raise
    wait_for(lambda: len(_effects(database)) >= 40, timeout=RECOVERY_BOUND - (time.monotonic() - healed),
             what="every message published after the heal handled within the bound")
    print(f"recovered {time.monotonic() - healed:.1f} s after the heal")  # pytest -s shows the figure
    assert net_proxy.stale_sends == 0, f"connections that died in the blackhole were used after the heal: {net_proxy.stale_samples}"
    wait_for(lambda: redis.xpending("dbjobs", "d")["pending"] == 0, timeout=30, what="everything acked")
    effects = _effects(database)
    assert sorted(effects) == sorted(before + during)  # nothing lost, nothing run twice
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.output()[-3000:]


def test_the_reclaimer_works_again_soon_after_a_blackhole(redis, net_proxy, run_consumer):
    """The reclaim daemon through the proxy: after the heal, entries over their delivery limit are
    dead-lettered within the bound (plus its pass interval)."""
    redis.xgroup_create("jobs", "a", id="0", mkstream=True)
    daemon = run_consumer("--interval", "1", command="runreclaimer", server=net_proxy)
    daemon.wait_for_output("Reclaimer: watching")
    net_proxy.blackhole()
    time.sleep(FAULT)  # the fault itself is what is under test
    net_proxy.heal()
    healed = time.monotonic()
    ids = [redis.xadd("jobs", {"payload": json.dumps({"n": n})}) for n in range(10)]
    redis.xreadgroup("a", "ghost", {"jobs": ">"})
    redis.xclaim("jobs", "a", "ghost", 0, ids, idle=600_000, retrycount=5, justid=True)  # over the limit, long idle
    wait_for(lambda: redis.xpending("jobs", "a")["pending"] == 0, timeout=RECOVERY_BOUND + 1,
             what=f"the reclaimer dead-lettering within {RECOVERY_BOUND} s of the heal (+ its 1 s interval)")
    print(f"reclaimer recovered {time.monotonic() - healed:.1f} s after the heal")
    assert net_proxy.stale_sends == 0, f"connections that died in the blackhole were used after the heal: {net_proxy.stale_samples}"
    assert sorted(f["shoal:origin_id"] for _, f in redis.xrange("{jobs}:dlq")) == sorted(ids)
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0, daemon.output()[-3000:]


def test_the_outbox_relay_works_again_soon_after_a_blackhole(redis, redis_server, net_proxy, run_consumer, database):
    """``runrelay`` through the proxy: rows committed after the heal reach the stream within the bound."""
    from tests.streams_app.outbox.test_outbox_processes import STREAM, waiting_rows, write_orders

    relay = run_consumer(command="runrelay", server=net_proxy, env={"DATABASE_URL": database.url})
    relay.wait_for_output("relaying the outbox", timeout=60)
    net_proxy.blackhole()
    time.sleep(FAULT)  # the fault itself is what is under test
    net_proxy.heal()
    healed = time.monotonic()
    write_orders(database, redis_server, "after-1", "after-2", "after-3")
    wait_for(lambda: redis.xlen(STREAM) == 3 and waiting_rows(database) == 0,
             timeout=RECOVERY_BOUND - (time.monotonic() - healed),
             what=f"the rows committed after the heal relayed within {RECOVERY_BOUND} s of it")
    print(f"relay recovered {time.monotonic() - healed:.1f} s after the heal")
    relay.signal(signal.SIGTERM)
    assert relay.wait(30) == 0, relay.output()[-3000:]
