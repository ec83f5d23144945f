"""Ordered mode (``@consumer(..., ordered=True)``): partition leases, fencing, per-key order, rebalancing.

Handlers in tests/testapp/consumers.py (``records_its_order``) record ``seen:<key>`` and a ``trace`` of
"partition consumer start end" on the Redis clock, so the tests check per-key order and that no two
handlers of one partition ever ran at the same time, across real runconsumer processes.
"""
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import REGISTRY

from streams_app import publish, publish_many
from streams_app.partitioning import partitions
from streams_app.conf import get_settings
from streams_app.redis.connection import node_client
from streams_app.redis.connection import dedicated_connection, get_connection
from streams_app.consuming.eventloop import EventLoopRunner
from streams_app.consuming.leases import Coordinator, Lease
from streams_app.consuming.ordered import OrderedGroupLoop
from streams_app.consuming.worker import Shutdown
from streams_app.exceptions import ConsumerConfigError
from streams_app.redis.keys import lease_key
from streams_app.registry import consumer, select
from tests.processes import descendants
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis

N = 4
# Short leases so takeover after a SIGKILL is quick; the interval stays below a third of the TTL.
LEASES = {"LEASE_TTL_MS": 2000, "LEASE_INTERVAL_MS": 400}


@pytest.fixture
def ordered(settings, redis):
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"ordered": N}, **LEASES}
    return partitions.names("ordered")


def owners(redis, names, group="o"):
    """Partition -> consumer name holding its lease (None when free)."""
    values = [redis.get(lease_key(name, group)) for name in names]
    return {name: value.rsplit("#", 1)[0] if value else None for name, value in zip(names, values)}


def consumer_of(proc):
    return proc.pid  # consumer names are host-<pid>-<random>


def held_by_pid(redis, names):
    counts = defaultdict(int)
    for owner in owners(redis, names).values():
        if owner is not None:
            counts[int(owner.rsplit("-", 2)[1])] += 1
    return dict(counts)


def assert_per_key_order(redis, keys, expected):
    """Every n of each key handled; in order (a takeover may repeat a suffix, never reorder)."""
    for key in keys:
        seen = [int(n) for n in redis.lrange(f"seen:{key}", 0, -1)]
        assert sorted(set(seen)) == expected[key], f"{key}: lost entries, saw {seen}"
        first = list(dict.fromkeys(seen))
        last = list(dict.fromkeys(reversed(seen)))[::-1]
        assert first == expected[key] and last == expected[key], f"{key}: out of order: {seen}"


def assert_no_overlap(redis):
    """No two handlers of one partition ran at once (each trace interval starts after the previous ended)."""
    by_partition = defaultdict(list)
    for line in redis.lrange("trace", 0, -1):
        partition, name, start, end = line.split()
        by_partition[partition].append((int(start), int(end), name))
    assert by_partition
    for partition, runs in by_partition.items():
        runs.sort()
        for (_, end, name), (start, _, other) in zip(runs, runs[1:]):
            assert start >= end, f"{partition}: {other} started at {start} while {name} ran until {end}"


def keyed(count, keys, first=0, **extra):
    payloads = [{"key": keys[n % len(keys)], "n": n, **extra} for n in range(first, first + count)]
    return payloads, [p["key"] for p in payloads]


def expected_of(payload_lists):
    expected = defaultdict(list)
    for payloads in payload_lists:
        for p in payloads:
            expected[p["key"]].append(p["n"])
    return expected


# -- in one process: the lease, fencing, a failing entry --------------------------------------

def test_ordered_must_be_a_boolean():
    with pytest.raises(ConsumerConfigError, match="ordered must be True or False"):
        consumer("x", group="g", ordered="yes")


@pytest.fixture
def make_ordered(redis, settings):
    settings.STREAMS = {**settings.STREAMS, "LEASE_TTL_MS": 300, "LEASE_INTERVAL_MS": 100}
    executors = []

    def make(name, selector="single:o"):
        [spec] = select([selector])
        config = {**get_settings(), "BLOCK_MS": 50}
        lease = Lease(spec.stream, spec.group, name, config["LEASE_TTL_MS"])
        executor = EventLoopRunner(10) if spec.is_async else ThreadPoolExecutor(1)
        executors.append(executor)
        loop = OrderedGroupLoop(spec, name, lease=lease, conn=get_connection(), reader=dedicated_connection(f"t-{name}"),
                                executor=executor, threads=1, shutdown=Shutdown(), config=config)
        coordinator = Coordinator(get_connection(), spec.logical, spec.group, name, [lease], ttl_ms=config["LEASE_TTL_MS"],
                                  interval_ms=config["LEASE_INTERVAL_MS"])
        return loop, coordinator

    yield make
    for executor in executors:
        executor.shutdown() if isinstance(executor, EventLoopRunner) else executor.shutdown(wait=True)


def test_an_owner_paused_past_the_lease_can_neither_ack_nor_read(redis, make_ordered):
    a, a_leases = make_ordered("a")
    b, b_leases = make_ordered("b")
    ids = [publish("single", {"key": "k", "n": n}) for n in range(3)]
    a_leases.tick()
    a.tick()  # takes the partition over (nothing pending)
    assert a.lease.state == "owned"
    assert [entry[0] for entry in a.read_owned(10, time.monotonic())] == ids
    # "a" is paused: no renewal. Its lease lapses on the Redis clock and "b" gets it.
    wait_for(lambda: redis.get(lease_key("single", "o")) is None, timeout=5, what="the lease to lapse")
    b_leases.tick()
    assert b.lease.state == "taken"
    b.tick()  # takes over what "a" read and hands it out again, in order
    assert b.lease.state == "owned" and b.replaying

    # "a" wakes up and acts as if it still owned the partition: Redis refuses both.
    a.to_ack = list(ids)
    a.flush_acks()
    assert a.lease.state == "free" and not a.to_ack
    pending = redis.xpending_range("single", "o", min="-", max="+", count=10)
    assert [p["message_id"] for p in pending] == ids and {p["consumer"] for p in pending} == {"b"}
    publish("single", {"key": "k", "n": 3})
    a.lease.granted("a#1", time.monotonic())  # even with its stale token it believes in
    a.lease.taken_over("a#1")
    assert a.read_owned(10, time.monotonic()) == [] and a.lease.state == "free"
    assert redis.xpending("single", "o")["pending"] == 3  # the new entry was not read by "a"


@pytest.mark.parametrize("stream", ["single", "aordered", "iordered"])
def test_a_failing_entry_blocks_its_partition_until_it_succeeds(redis, make_ordered, stream):
    loop, leases = make_ordered("a", f"{stream}:o")
    publish(stream, {"key": "k", "n": 0, "fail": 3})  # fails deliveries 1 and 2
    for n in (1, 2):
        publish(stream, {"key": "k", "n": n})
    leases.tick()
    deadline = time.monotonic() + 20
    while redis.llen("seen:k") < 3:
        assert time.monotonic() < deadline, redis.lrange("seen:k", 0, -1)
        leases.tick()
        loop.tick()
    assert redis.lrange("seen:k", 0, -1) == ["0", "1", "2"]
    while redis.xpending(stream, "o")["pending"]:
        assert time.monotonic() < deadline, "the last entry was not acked"
        loop.tick()


def run_until(loop, leases, done, what, timeout=20):
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, what
        leases.tick()
        loop.tick()


def test_entries_behind_a_failure_keep_their_deliveries_with_max_deliveries_1(redis, make_ordered):
    """Only the failing entry's delivery counts: those that waited behind it run, at delivery 1."""
    loop, leases = make_ordered("a", "oonce:o")
    publish("oonce", {"key": "k", "n": 0, "fail": 2})  # fails its only delivery: dead-lettered
    for n in (1, 2):
        publish("oonce", {"key": "k", "n": n})
    run_until(loop, leases, lambda: redis.llen("seen:k") == 2 and not redis.xpending("oonce", "o")["pending"],
              f"entries 1 and 2 to run: {redis.lrange('deliveries:k', 0, -1)}")
    assert redis.lrange("seen:k", 0, -1) == ["1", "2"]
    assert redis.lrange("deliveries:k", 0, -1) == ["0:1", "1:1", "2:1"]
    [(_, dead)] = redis.xrange("{oonce}:dlq")
    assert dead["shoal:error"].startswith("RuntimeError: asked to fail delivery 1"), dead


def test_deliveries_count_the_runs_of_each_entry_after_a_retry_and_a_takeover(redis, make_ordered):
    loop, leases = make_ordered("a", "othrice:o")
    publish("othrice", {"key": "k", "n": 0, "fail": 3})  # fails deliveries 1 and 2
    for n in (1, 2):
        publish("othrice", {"key": "k", "n": n})
    run_until(loop, leases, lambda: redis.llen("seen:k") == 3, "all three to run")
    assert redis.lrange("deliveries:k", 0, -1) == ["0:1", "0:2", "0:3", "1:1", "2:1"]

    # "b" read two entries, never ran them and was paused past its lease: "a" delivers them again.
    b, b_leases = make_ordered("b", "othrice:o")
    leases.leave()
    loop.lease.lost(loop.lease.token)
    ids = [publish("othrice", {"key": "k2", "n": n}) for n in range(2)]
    b_leases.tick()
    b.tick()
    assert [entry[0] for entry in b.read_owned(10, time.monotonic())] == ids
    wait_for(lambda: redis.get(lease_key("othrice", "o")) is None, timeout=5, what="b's lease to lapse")
    a2, a2_leases = make_ordered("a2", "othrice:o")
    run_until(a2, a2_leases, lambda: redis.llen("seen:k2") == 2, "the new owner to run them")
    assert redis.lrange("deliveries:k2", 0, -1) == ["0:2", "1:2"]


def test_a_one_partition_selector_of_an_ordered_consumer_is_refused(ordered, redis):
    """It would join the lease membership as a full member: the others take fewer leases, some none."""
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError) as raised:
        call_command("runconsumer", f"{ordered[1]}:o")
    assert raised.value.returncode == 3
    assert "ordered=True" in str(raised.value) and "Select the whole stream (ordered:o)" in str(raised.value)
    assert not redis.exists("{ordered}:members:o")
    with pytest.raises(ConsumerConfigError, match="names one partition"):
        select([f"{ordered[0]}:o"])
    assert [spec.stream for spec in select(["ordered:o"])] == ordered


def held_metric(consumer_name):
    return REGISTRY.get_sample_value("shoal_partitions_held", {"logical_stream": "single", "group": "o",
                                                                "consumer": consumer_name})


def test_a_clean_stop_releases_the_lease_at_once(redis, make_ordered):
    loop, leases = make_ordered("a")
    leases.tick()
    loop.tick()
    assert redis.get(lease_key("single", "o")) == "a#1"
    assert held_metric("a") == 1
    loop.shutdown.set()
    loop.drain()
    leases.leave()
    assert redis.get(lease_key("single", "o")) is None
    assert redis.hgetall("{single}:members:o") == {}
    assert held_metric("a") is None


# -- real runconsumer processes ------------------------------------------------------------------

def sample_leases(redis, names, stop, samples):
    while not stop.is_set():
        samples.append(owners(redis, names))
        stop.wait(0.02)


@pytest.mark.slow
def test_join_and_clean_leave_rebalance_and_no_partition_has_two_handlers(ordered, redis, run_consumer):
    streams = {"PARTITIONS": {"ordered": N}, **LEASES}
    keys = [f"customer-{k}" for k in range(12)]
    stop, samples = threading.Event(), []
    sampler = threading.Thread(target=sample_leases, args=(redis, ordered, stop, samples), daemon=True)
    sampler.start()
    first = run_consumer("ordered:o", "--threads", "2", streams=streams)
    wait_for(lambda: held_by_pid(redis, ordered) == {first.pid: N}, timeout=60, what="the first consumer to hold all")
    sent = []
    batch, names = keyed(100, keys, sleep=0.002)
    publish_many("ordered", batch, keys=names)
    sent.append(batch)

    second = run_consumer("ordered:o", "--threads", "2", streams=streams)
    wait_for(lambda: any(f"-{second.pid}-" in m for m in redis.hkeys("{ordered}:members:o")), timeout=60,
             what="the second consumer to join")
    joined = time.monotonic()
    for i in range(1, 4):  # traffic while the second joins
        batch, names = keyed(100, keys, first=100 * i, sleep=0.002)
        publish_many("ordered", batch, keys=names)
        sent.append(batch)
    wait_for(lambda: held_by_pid(redis, ordered) == {first.pid: N // 2, second.pid: N // 2}, timeout=60,
             what="two leases each")
    join_seconds = time.monotonic() - joined
    # The sampler runs every 20 ms on a GIL shared with this thread: let it record the split before the
    # leave ends it, or a loaded machine can miss a window this test opened and closed itself.
    wait_for(lambda: any(f"-{second.pid}-" in (owner or "") for sample in samples[-5:] for owner in sample.values()),
             timeout=30, what="the sampler to record the second's leases")

    left = time.monotonic()
    second.signal(signal.SIGTERM)
    batch, names = keyed(100, keys, first=400, sleep=0.002)
    publish_many("ordered", batch, keys=names)
    sent.append(batch)
    wait_for(lambda: held_by_pid(redis, ordered) == {first.pid: N}, timeout=60, what="the first to hold all again")
    leave_seconds = time.monotonic() - left
    assert second.wait(timeout=60) == 0, second.output()

    expected = expected_of(sent)
    wait_for(lambda: sum(redis.llen(f"seen:{k}") for k in keys) >= 500, timeout=90, what="500 handled")
    stop.set()
    sampler.join()
    assert_per_key_order(redis, keys, expected)
    assert_no_overlap(redis)
    names_seen = {owner for sample in samples for owner in sample.values() if owner}
    assert len(names_seen) == 2 and all(str(p.pid) in " ".join(names_seen) for p in (first, second))
    # Clean leave: the leases came back at once, not after a lapse of LEASE_TTL_MS.
    assert leave_seconds < LEASES["LEASE_TTL_MS"] / 1000, leave_seconds
    print(f"rebalance after a join {join_seconds:.2f}s, after a clean leave {leave_seconds:.2f}s")


def owner_pids(redis, names):
    """Partition -> pid of the consumer holding its lease (None when free)."""
    return {name: int(owner.rsplit("-", 2)[1]) if owner else None for name, owner in owners(redis, names).items()}


@pytest.mark.slow
def test_per_key_order_holds_across_a_sigkill_of_one_of_two_supervisors(ordered, redis, run_consumer):
    """Two supervisors of two workers each (one partition per worker); one supervisor is SIGKILLed with
    its workers, as when its host is lost: no release, the leases lapse on the Redis clock."""
    streams = {"PARTITIONS": {"ordered": N}, **LEASES}
    keys = [f"customer-{k}" for k in range(16)]
    first = run_consumer("ordered:o", "--workers", "2", "--threads", "2", streams=streams)
    second = run_consumer("ordered:o", "--workers", "2", "--threads", "2", streams=streams)

    def workers(sup):
        return set(descendants(sup.pid))

    wait_for(lambda: len(set(owner_pids(redis, ordered).values()) - {None}) == N
             and set(owner_pids(redis, ordered).values()) <= workers(first) | workers(second),
             timeout=90, what="one partition per worker")
    sent = []
    batch, names = keyed(300, keys, sleep=0.003)
    publish_many("ordered", batch, keys=names)
    sent.append(batch)
    wait_for(lambda: redis.llen("trace") >= 60, timeout=60, what="some handled")
    doomed = workers(second)
    for pid in doomed:
        os.kill(pid, signal.SIGKILL)
    second.kill()
    killed = time.monotonic()
    batch, names = keyed(300, keys, first=300, sleep=0.001)
    publish_many("ordered", batch, keys=names)
    sent.append(batch)
    survivors = workers(first)
    wait_for(lambda: set(owner_pids(redis, ordered).values()) <= survivors, timeout=60,
             what="the survivors to hold every partition")
    takeover = time.monotonic() - killed
    wait_for(lambda: len({(k, n) for k in keys for n in redis.lrange(f"seen:{k}", 0, -1)}) >= 600, timeout=120,
             what="all 600 handled")
    assert_per_key_order(redis, keys, expected_of(sent))
    assert_no_overlap(redis)
    ttl, interval = LEASES["LEASE_TTL_MS"] / 1000, LEASES["LEASE_INTERVAL_MS"] / 1000
    assert takeover <= ttl + interval + 2.0, takeover  # + polling and a loaded machine's slack
    assert first.proc.poll() is None, first.output()
    held = sorted(Counter(owner_pids(redis, ordered).values()).values())
    assert held == [N // 2, N // 2], held  # balanced over the two surviving workers
    print(f"takeover after SIGKILL {takeover:.2f}s (lease {ttl}s + interval {interval}s)")


def test_a_group_destroyed_under_an_ordered_loop_is_recreated(redis, make_ordered):
    loop, leases = make_ordered("a")
    leases.tick()
    loop.step()
    publish("single", {"key": "k", "n": 0})
    redis.xgroup_destroy("single", "o")
    loop.step()  # NOGROUP from inside the fenced read script: a lost group, not a crash
    publish("single", {"key": "k", "n": 1})
    deadline = time.monotonic() + 20
    while redis.llen("seen:k") < 2:
        assert time.monotonic() < deadline
        leases.tick()
        loop.step()
    assert redis.lrange("seen:k", 0, -1) == ["0", "1"]  # nothing was read before: recreated at start, in order


def test_members_share_the_leases_by_hrw_and_no_partition_is_ever_trusted_by_two(redis):
    """Coordinators in this process, driven pass by pass; each lease's read loop is played by
    finishing takeovers and releases at once. After every pass no partition is trusted by two members."""
    names = partitions.names("hrw", 6)
    conn = get_connection()

    def member(name):
        leases = [Lease(p, "g", name, 600) for p in names]
        return Coordinator(conn, "hrw", "g", name, leases, ttl_ms=600, interval_ms=100)

    def check():
        for index, p in enumerate(names):
            trusted = [m.consumer for m in [*members.values(), *gone] if m.leases[index].valid()]
            assert len(trusted) <= 1, f"{p} trusted by {trusted}"

    def rounds(until, timeout=10):
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, {m.consumer: held(m) for m in members.values()}
            for m in list(members.values()):
                m.tick()
                for lease in m.leases:
                    if lease.state == "taken":
                        lease.taken_over(lease.token)
                    elif lease.state == "releasing":
                        lease.release(conn)
                check()
            time.sleep(0.02)

    def held(m):
        return sorted(lease.stream for lease in m.leases if lease.holding)

    def balanced(count):
        return lambda: (sum(len(held(m)) for m in members.values()) == 6
                        and all(len(held(m)) <= -(-6 // count) for m in members.values()))

    members = {n: member(n) for n in ("a", "b", "c")}
    gone = []  # a crashed member still trusts its leases until its local deadlines pass
    rounds(balanced(3))
    before = {p: m.consumer for m in members.values() for p in held(m)}
    members["d"] = member("d")
    rounds(balanced(4))
    after = {p: m.consumer for m in members.values() for p in held(m)}
    moved = sum(before[p] != after[p] for p in names)
    assert moved <= 3, (before, after)  # sticky: d takes its share, the rest stay (6 partitions, 4 members)
    gone.append(members.pop("c"))  # stops renewing, releases nothing: its leases lapse in Redis
    rounds(balanced(3), timeout=15)
    members["a"].leave()
    members.pop("a")
    rounds(balanced(2))


def test_a_crashed_coordinator_crashes_the_read_loop_instead_of_leaving_it_idle(redis, make_ordered):
    loop, leases = make_ordered("a")
    leases.members = None  # calling it raises TypeError: a bug, not a Redis error
    leases.start()
    wait_for(lambda: loop.lease.failed is not None, timeout=5, what="the coordinator to fail")
    with pytest.raises(RuntimeError, match="lease coordinator of single/o crashed"):
        loop.step()


def test_sigterm_cuts_an_ordered_loops_blocked_wait_short_and_releases_the_lease(redis, run_consumer):
    # An idle owner waits in XREAD BLOCK (not XREADGROUP: see OrderedGroupLoop.read_owned); a stop
    # unblocks it too, so the consumer exits at once rather than after --block-ms.
    proc = run_consumer("single:o", "--block-ms", "20000", streams={"LEASE_TTL_MS": 60_000, "LEASE_INTERVAL_MS": 1000})
    wait_for(lambda: any(c.get("cmd") == "xread" and c.get("name", "").startswith("shoal-reader:")
                         for c in node_client(redis, "single").client_list()), timeout=30,
             what="the owner's blocked wait")
    assert redis.get(lease_key("single", "o"))
    stopped = time.monotonic()
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()
    assert time.monotonic() - stopped < 10
    assert redis.get(lease_key("single", "o")) is None  # released, not left to lapse (60 s)


@pytest.mark.slow
def test_an_owner_paused_past_the_lease_hands_over_and_handles_nothing_after_it_wakes(redis, run_consumer):
    """SIGSTOP the owner of a one-partition ordered stream past LEASE_TTL_MS: the standby takes over;
    after SIGCONT the old owner finds its lease gone and neither reads nor handles anything."""
    streams = dict(LEASES)
    first = run_consumer("single:o", streams=streams)
    wait_for(lambda: owner_pids(redis, ["single"])["single"] == first.pid, timeout=60, what="the first to own it")
    second = run_consumer("single:o", streams=streams)
    wait_for(lambda: any(f"-{second.pid}-" in m for m in redis.hkeys("{single}:members:o")), timeout=60,
             what="the second to stand by")
    os.kill(first.pid, signal.SIGSTOP)
    paused = time.monotonic()
    try:
        wait_for(lambda: owner_pids(redis, ["single"])["single"] == second.pid, timeout=30, what="the standby to own it")
        takeover = time.monotonic() - paused
        publish_many("single", [{"key": f"k{n % 5}", "n": n} for n in range(50)], keys=[f"k{n % 5}" for n in range(50)])
        wait_for(lambda: redis.llen("trace") >= 50, timeout=60, what="50 handled by the standby")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    first.wait_for_output("lost the lease", timeout=30)
    publish_many("single", [{"key": f"k{n % 5}", "n": n} for n in range(50, 100)], keys=[f"k{n % 5}" for n in range(50, 100)])
    wait_for(lambda: redis.llen("trace") >= 100, timeout=60, what="100 handled")
    handlers = {line.split()[1] for line in redis.lrange("trace", 0, -1)}
    assert len(handlers) == 1 and f"-{second.pid}-" in handlers.pop()  # the paused one handled nothing
    assert_per_key_order(redis, [f"k{k}" for k in range(5)], {f"k{k}": list(range(k, 100, 5)) for k in range(5)})
    assert owner_pids(redis, ["single"])["single"] == second.pid and first.proc.poll() is None
    ttl, interval = LEASES["LEASE_TTL_MS"] / 1000, LEASES["LEASE_INTERVAL_MS"] / 1000
    assert takeover <= ttl + interval + 2.0, takeover


@pytest.mark.slow
def test_after_a_sigkill_the_new_owner_counts_a_delivery_for_every_entry_it_redoes(redis, run_consumer):
    """The killed owner had read a batch of three and was running the first: each is delivered again."""
    publish_many("othrice", [{"key": "k", "n": 0, "sleep": 1.0}, {"key": "k", "n": 1}, {"key": "k", "n": 2}],
                 keys=["k"] * 3)
    first = run_consumer("othrice:o", streams=LEASES)
    wait_for(lambda: redis.lrange("deliveries:k", 0, -1) == ["0:1"], timeout=60, what="the first entry to start")
    first.kill()
    second = run_consumer("othrice:o", streams=LEASES)
    wait_for(lambda: redis.llen("seen:k") == 3, timeout=90, what=f"the new owner to run all three: {second.output()}")
    assert redis.lrange("seen:k", 0, -1) == ["0", "1", "2"]
    assert redis.lrange("deliveries:k", 0, -1) == ["0:1", "0:2", "1:2", "2:2"]



def group_on(redis, stream, group="o"):
    return any(g["name"] == group for g in redis.xinfo_groups(stream))


def readers_waiting(redis, count):
    """``count`` ordered owners idle in their plain XREAD (a destroyed group goes unnoticed meanwhile)."""
    waiting = {c["addr"] for name in partitions.names("ordered") for c in node_client(redis, name).client_list()
               if c.get("cmd") == "xread" and c.get("name", "").startswith("shoal-reader:")}  # nodes of a cluster too
    return len(waiting) >= count


@pytest.mark.slow
def test_xgroup_destroy_under_ordered_consumers_runs_nothing_twice_and_keeps_key_order(ordered, redis, run_consumer):
    """Two consumers of two threads, keyed messages published all along, every start counted per entry id.

    Busy: the group destroyed on every partition twice; each partition's owner finds it gone at once and
    recreates it at its own last read. Quiet: one consumer leaves, the other takes its partitions over
    and waits in XREAD; the group is destroyed and created again at "0" before it notices, as a consumer
    starting in between does (its ensure_group at ``start``). Before the fix the owner then read its
    partitions from the beginning again: entries ran a second time, each key's messages out of order."""
    streams = {"PARTITIONS": {"ordered": N}, **LEASES, "BLOCK_MS": 500, "PENDING_TIMEOUT_MS": 2000}
    keys = [f"customer-{k}" for k in range(12)]
    workers = [run_consumer("ordered:o", "--threads", "2", streams=streams) for _ in range(2)]
    wait_for(lambda: sorted(held_by_pid(redis, ordered).values()) == [N // 2, N // 2], timeout=60,
             what="two leases each")
    sent, done = [], threading.Event()

    def publish_all_along():
        while not done.is_set():
            batch, names = keyed(4, keys, first=published(), sleep=0.002)
            publish_many("ordered", batch, keys=names)
            sent.append(batch)
            done.wait(0.005)

    def published():
        return sum(len(batch) for batch in sent)

    def busy_for(handled):
        done.clear()
        publisher = threading.Thread(target=publish_all_along)
        publisher.start()
        try:
            count = redis.llen("trace")
            wait_for(lambda: redis.llen("trace") >= count + handled, timeout=60, what="consumers busy")
        finally:
            done.set()
            publisher.join()

    def all_handled():
        return (len(set(redis.lrange("ordered-started", 0, -1))) >= published()
                and all(redis.xpending(name, "o")["pending"] == 0 for name in ordered))

    publisher = threading.Thread(target=publish_all_along)
    publisher.start()
    try:
        for _ in range(2):
            count = redis.llen("trace")
            wait_for(lambda c=count: redis.llen("trace") >= c + 100, timeout=60, what="consumers busy")
            for name in ordered:
                redis.xgroup_destroy(name, "o")
            wait_for(lambda: all(group_on(redis, name) for name in ordered), timeout=60, what="the groups recreated")
    finally:
        done.set()
        publisher.join()
    wait_for(all_handled, timeout=120, what="every message handled")
    staying, leaving = workers
    leaving.signal(signal.SIGTERM)
    assert leaving.wait(60) == 0, leaving.output()
    wait_for(lambda: held_by_pid(redis, ordered) == {staying.pid: N}, timeout=60, what="one consumer holding all")
    wait_for(lambda: readers_waiting(redis, N), timeout=60, what="its read loops idle in XREAD")
    for name in ordered:
        pipe = redis.pipeline(transaction=True)
        pipe.xgroup_destroy(name, "o")
        pipe.xgroup_create(name, "o", id="0")
        pipe.execute()
    busy_for(100)
    wait_for(all_handled, timeout=120, what="every message handled")
    assert staying.proc.poll() is None, staying.output()
    twice = {entry: n for entry, n in Counter(redis.lrange("ordered-started", 0, -1)).items() if n > 1}
    assert twice == {}, f"{len(twice)} of {published()} entries ran more than once"
    assert_per_key_order(redis, keys, expected_of(sent))
    assert_no_overlap(redis)


def test_a_failed_entry_and_those_behind_it_survive_a_group_destroyed_while_they_wait(redis, make_ordered, settings):
    """The failed head and the entries read behind it wait in the PEL only; a lost group takes the PEL
    with it. Before the fix they were neither retried nor dead-lettered: seen:k stayed empty."""
    settings.STREAMS = {**settings.STREAMS, "PENDING_TIMEOUT_MS": 1000}  # a short settling time
    loop, leases = make_ordered("a", "owaits:o")
    publish("owaits", {"key": "k", "n": 0, "fail": 2})  # fails its first delivery, then waits 1 s
    for n in (1, 2):
        publish("owaits", {"key": "k", "n": n})
    run_until(loop, leases, lambda: loop.replaying and not loop.chunks and redis.lrange("trace", 0, -1) == []
              and redis.xpending("owaits", "o")["pending"] == 3, "the first delivery to fail")
    redis.xgroup_destroy("owaits", "o")
    deadline = time.monotonic() + 20
    while not (redis.llen("seen:k") == 3 and not redis.xpending("owaits", "o")["pending"]):
        assert time.monotonic() < deadline, f"all three to run after the loss: {redis.lrange('seen:k', 0, -1)}"
        leases.tick()
        loop.step()  # step(), not tick(): finds the group lost and recreates it
    assert redis.lrange("seen:k", 0, -1) == ["0", "1", "2"]
