"""The README's delivery guarantees under slow handlers, hoarding, flushes, a full Redis and replays to
missing groups (issue 13), with real ``runconsumer``/``runreclaimer``/``replay`` processes.

Counting is strict: ``started:<stream>:<group>`` lists every handler start and ``handled:...`` every
handler end (tests/testapp/consumers.py), so a second run of any entry shows as a duplicate id.
"""
import json
import signal
import time
from collections import Counter

import pytest

from tests.streams_app.consuming.test_failure_processes import database_url, run_command  # noqa: F401 (fixtures)
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


def duplicates(redis, kind, stream, group):
    return {i: n for i, n in Counter(redis.lrange(f"{kind}:{stream}:{group}", 0, -1)).items() if n > 1}


def stop(*procs):
    for proc in procs:
        proc.signal(signal.SIGTERM)
    return [proc.wait(60) for proc in procs]


def reader_blocked(redis):
    return any(c.get("name", "").startswith("shoal-reader:") and c.get("cmd") == "xreadgroup"
               for c in redis.client_list())


# -- 1. a handler slower than the pending timeout ----------------------------------------------------

SLOW = {"PENDING_TIMEOUT_MS": 1500, "CLAIM_INTERVAL_MS": 200, "BLOCK_MS": 500, "RECLAIM_INTERVAL": 0.2}


def test_a_live_handler_slower_than_the_pending_timeout_is_neither_taken_over_nor_dead_lettered(redis, run_command):
    """max_deliveries=1, 1.5 s pending timeout, 5 s handler, a second consumer and a reclaim daemon
    polling every 0.2 s: before the fix the daemon dead-lettered the entry while it ran."""
    entry = redis.xadd("slow", {"payload": json.dumps({"sleep": 5})})
    first = run_command("runconsumer", "slow:once", "--threads", "1", streams=SLOW)
    wait_for(lambda: redis.llen("started:slow:once") == 1, timeout=60, what="the handler started")
    second = run_command("runconsumer", "slow:once", "--threads", "1", streams=SLOW)
    daemon = run_command("runreclaimer", "--interval", "0.2", streams=SLOW)
    # Under load the daemon may start after the handler ended (and get TERM before its handler is set).
    wait_for(lambda: "Reclaimer: watching" in daemon.output(), timeout=60, what="the reclaim daemon polling")
    wait_for(lambda: redis.llen("handled:slow:once") == 1 and redis.xpending("slow", "once")["pending"] == 0,
             timeout=60, what="the slow handler finished and acked")
    # Both latecomers up before they are told to stop (under CI's load a TERM once reached the
    # reclaimer before Python had started it, and it died of the signal: -15).
    wait_for(lambda: "started" in second.output() and "Reclaimer: watching" in daemon.output(), timeout=60,
             what="the second consumer and the reclaimer running")
    assert stop(first, second, daemon) == [0, 0, 0], [p.output() for p in (first, second, daemon)]
    assert redis.lrange("started:slow:once", 0, -1) == [entry]  # ran once, by one consumer
    assert redis.xlen("{slow}:dlq") == 0, redis.xrange("{slow}:dlq")  # and was not also dead-lettered


def test_redis_guarded_slow_handlers_on_two_healthy_consumers_run_each_key_once(redis, run_command):
    """idempotent="redis", two consumers, 4 s handlers, 1.5 s pending timeout, nothing killed: before the
    fix the running mark expired with the pending timeout and the other consumer ran the key too."""
    ids = [redis.xadd("idem", {"payload": json.dumps({"sleep": 4}), "key": f"k{n}"}) for n in range(4)]
    workers = [run_command("runconsumer", "idem:r", "--threads", "2", streams=SLOW) for _ in range(2)]
    wait_for(lambda: redis.llen("handled:idem:r") >= 4 and redis.xpending("idem", "r")["pending"] == 0,
             timeout=90, what="every key handled and acked")
    assert stop(*workers) == [0, 0], [w.output() for w in workers]
    assert sorted(redis.lrange("handled:idem:r", 0, -1)) == sorted(ids)  # every effect exactly once
    assert redis.xlen("{idem}:dlq") == 0


# -- 2. hoarding: fast traffic, then slow entries ------------------------------------------------------

def test_fast_then_slow_traffic_is_not_handled_twice_by_competing_consumers(redis, run_command):
    """600 fast entries grow the read size, then 40 entries of 0.25 s each land in one worker's reads:
    more than its two threads can start within the 1.5 s pending timeout. Before the fix the other
    consumer took the queued ones over and ran them a second time."""
    pipe = redis.pipeline(transaction=False)
    for n in range(600):
        pipe.xadd("jobs", {"payload": json.dumps({"n": n})})
    for n in range(40):
        pipe.xadd("jobs", {"payload": json.dumps({"n": n, "sleep": 0.25})})
    ids = pipe.execute()
    workers = [run_command("runconsumer", "jobs:a", "--threads", "2", streams=SLOW) for _ in range(2)]
    wait_for(lambda: len(set(redis.lrange("handled:jobs:a", 0, -1))) == len(ids)
             and redis.xpending("jobs", "a")["pending"] == 0, timeout=120, what="every entry handled and acked")
    assert stop(*workers) == [0, 0], [w.output() for w in workers]
    assert duplicates(redis, "started", "jobs", "a") == {}
    assert redis.llen("started:jobs:a") == len(ids)


# -- 3. the stream or the group vanishes while a consumer is blocked -----------------------------------

@pytest.mark.parametrize("how", ["flushall", "flushdb", "del"])
def test_a_stream_flushed_or_deleted_under_a_blocked_read_is_recreated_not_a_crash(redis, run_command, how):
    """Before the fix the blocked XREADGROUP got 'UNBLOCKED the stream key no longer exists' and the
    process exited 1."""
    before = redis.xadd("jobs", {"payload": json.dumps({"n": 0})})
    worker = run_command("runconsumer", "jobs:a", streams={"BLOCK_MS": 5000})
    wait_for(lambda: redis.lrange("handled:jobs:a", 0, -1) == [before], timeout=60, what="the first entry handled")
    wait_for(lambda: reader_blocked(redis), timeout=30, what="the read loop blocked in XREADGROUP")
    {"flushall": redis.flushall, "flushdb": redis.flushdb, "del": lambda: redis.delete("jobs")}[how]()
    after = redis.xadd("jobs", {"payload": json.dumps({"n": 1})})
    wait_for(lambda: after in redis.lrange("handled:jobs:a", 0, -1), timeout=60, what="an entry published after the flush handled")
    assert worker.proc.poll() is None, worker.output()
    assert "vanished while consuming" in worker.output()
    assert stop(worker) == [0], worker.output()


def test_xgroup_destroy_while_consuming_recreates_the_group_after_what_was_read(redis, run_command):
    """Before the fix the group came back at "0": the whole stream handled again."""
    old = [redis.xadd("jobs", {"payload": json.dumps({"n": n})}) for n in range(20)]
    worker = run_command("runconsumer", "jobs:a", streams={"BLOCK_MS": 500})
    wait_for(lambda: redis.llen("handled:jobs:a") == 20 and redis.xpending("jobs", "a")["pending"] == 0,
             timeout=60, what="the first entries handled")
    redis.xgroup_destroy("jobs", "a")
    wait_for(lambda: any(g["name"] == "a" for g in redis.xinfo_groups("jobs")), timeout=30, what="the group recreated")
    new = redis.xadd("jobs", {"payload": json.dumps({"n": 20})})
    wait_for(lambda: new in redis.lrange("handled:jobs:a", 0, -1), timeout=60, what="a new entry handled")
    assert stop(worker) == [0], worker.output()
    assert sorted(redis.lrange("started:jobs:a", 0, -1)) == sorted(old + [new])  # nothing handled twice
    assert "XGROUP DESTROY" in worker.output()


def test_xgroup_destroy_under_several_live_consumers_runs_nothing_twice_and_skips_nothing(redis, run_command):
    """Three consumers, entries handed out one at a time so their last reads differ, the group destroyed
    three times (and an entry published while it is gone). Before the fix each consumer recreated the
    group at its own last read and the first one set the position: entries another consumer had
    already handled were delivered and run again (unless the first happened to have read last)."""
    streams = {"BLOCK_MS": 500, "PENDING_TIMEOUT_MS": 2000, "CLAIM_INTERVAL_MS": 200}
    workers = [run_command("runconsumer", "jobs:a", "--threads", "1", streams=streams) for _ in range(3)]
    published = []

    def publish_one(n):
        published.append(redis.xadd("jobs", {"payload": json.dumps({"n": n})}))

    wait_for(lambda: sum(c.get("cmd") == "xreadgroup" for c in redis.client_list()) == 3, timeout=60,
             what="three consumers blocked in XREADGROUP")
    for destroyed in range(1, 4):
        for n in range(12):
            publish_one(n)
            wait_for(lambda: published[-1] in redis.lrange("handled:jobs:a", 0, -1), timeout=30, what="entry handled")
        wait_for(lambda: redis.xpending("jobs", "a")["pending"] == 0, timeout=30, what="everything acked")
        redis.xgroup_destroy("jobs", "a")
        publish_one(-1)  # never delivered to the old group: must not be skipped
        wait_for(lambda n=destroyed: all(w.output().count("vanished while consuming") >= n for w in workers), timeout=60,
                 what="every consumer saw the group go")
    publish_one(99)
    wait_for(lambda: set(published) <= set(redis.lrange("handled:jobs:a", 0, -1)), timeout=90,
             what="every entry handled, those published while the group was gone included")
    assert stop(*workers) == [0, 0, 0], [w.output() for w in workers]
    assert duplicates(redis, "started", "jobs", "a") == {}
    assert sorted(redis.lrange("started:jobs:a", 0, -1)) == sorted(published)


@pytest.mark.parametrize("target, pool", [("jobs:a", ["--threads", "4"]), ("ajobs:a", ["--concurrency", "20"])],
                         ids=["sync", "async"])
def test_xgroup_destroy_under_busy_consumers_and_continuous_publishing_runs_nothing_twice(redis, run_command,
                                                                                          target, pool):
    """Three busy consumers, entries published all along, the group destroyed four times. Before the
    fix a consumer that had not yet noticed the loss read at once from the group another one had just
    recreated at an older id, and ran entries again that it or the others had already run."""
    import threading

    stream, group = target.split(":")
    streams = {"BLOCK_MS": 500, "PENDING_TIMEOUT_MS": 2000, "CLAIM_INTERVAL_MS": 200, "BATCH_SIZE": 20}
    workers = [run_command("runconsumer", target, *pool, streams=streams) for _ in range(3)]
    published = []
    done = threading.Event()

    def publish():
        while not done.is_set():
            published.append(redis.xadd(stream, {"payload": json.dumps({"sleep": 0.01})}))
            done.wait(0.003)

    wait_for(lambda: sum(c.get("cmd") == "xreadgroup" for c in redis.client_list()) == 3, timeout=60,
             what="three consumers blocked in XREADGROUP")
    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        for destroyed in range(1, 5):
            count = len(published)
            wait_for(lambda c=count: redis.llen(f"handled:{target}") >= c, timeout=60, what="consumers busy")
            redis.xgroup_destroy(stream, group)
            wait_for(lambda n=destroyed: sum(w.output().count(f"group {group} on {stream} recreated at") for w in workers) >= n,
                     timeout=60, what="the group recreated")
    finally:
        done.set()
        publisher.join()
    wait_for(lambda: set(published) <= set(redis.lrange(f"handled:{target}", 0, -1)), timeout=120,
             what="every entry handled")
    assert stop(*workers) == [0, 0, 0], [w.output() for w in workers]
    lost = [[line for line in w.output().splitlines() if "group" in line and group in line] for w in workers]
    assert duplicates(redis, "started", stream, group) == {}, lost
    assert set(redis.lrange(f"started:{target}", 0, -1)) == set(published)


# -- 4. Redis at maxmemory ---------------------------------------------------------------------------

@pytest.mark.parametrize("pool", [[], ["--workers", "2"]], ids=["single", "supervised"])
def test_at_maxmemory_a_consumer_keeps_reading_and_acking_and_says_so_once(redis_factory, run_consumer, pool):
    """noeviction at maxmemory: before the fix the liveness beat's OOM (or XGROUP CREATE's, at start)
    made the process exit 1 after a fraction of the backlog, and supervised workers crash-looped."""
    server = redis_factory()
    client = server.client()
    pipe = client.pipeline(transaction=False)
    for n in range(3000):
        pipe.xadd("noop", {"payload": json.dumps({"n": n})})
    pipe.execute()
    client.xgroup_create("noop", "bench", id="0")
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")  # every write that may grow memory is refused from now on
    worker = run_consumer("noop:bench", *pool, server=server, streams={"CONSUMER_TTL": 1, "BATCH_SIZE": 100})

    def drained():
        [group] = client.xinfo_groups("noop")
        return group["entries-read"] == 3000 and group["pending"] == 0

    wait_for(drained, timeout=120, what="the whole backlog read and acked at maxmemory")
    processes = 2 if pool else 1
    wait_for(lambda: worker.output().count("Redis is at maxmemory and refuses writes") >= processes, timeout=60,
             what="the OOM warning of every consuming process")
    assert worker.proc.poll() is None, worker.output()
    # Once per process, not per beat; no worker crashed or was replaced.
    assert worker.output().count("Redis is at maxmemory and refuses writes") == processes
    assert "crashed" not in worker.output() and "Traceback" not in worker.output()
    client.config_set("maxmemory", "0")
    wait_for(lambda: "Redis accepts writes again" in worker.output(), timeout=30, what="the recovery line")
    assert stop(worker) == [0], worker.output()


def test_at_maxmemory_redis_guarded_entries_that_never_ran_are_not_counted_or_dead_lettered(redis_factory, run_consumer):
    """idempotent="redis", max_deliveries=1, 1 s pending timeout, a reclaim daemon polling every 0.2 s:
    the guard's SET is refused, so no handler runs. Before the fix every retry counted as a delivery
    (times_delivered climbing, the back-off growing past the pending timeout) and the daemon
    dead-lettered the entries that never ran ("killed or stuck") as soon as Redis had room."""
    server = redis_factory()
    client = server.client()
    ids = [client.xadd("idemonce", {"payload": json.dumps({"n": n}), "key": f"k{n}"}) for n in range(10)]
    client.xgroup_create("idemonce", "r", id="0")
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    streams = {"PENDING_TIMEOUT_MS": 1000, "CLAIM_INTERVAL_MS": 100, "RECLAIM_INTERVAL": 0.2, "CONSUMER_TTL": 1}
    worker = run_consumer("idemonce:r", server=server, streams=streams)
    daemon = run_consumer("--interval", "0.2", server=server, streams=streams, command="runreclaimer")
    wait_for(lambda: "Redis is at maxmemory" in worker.output(), timeout=60, what="the guard's marks refused")
    wait_for(lambda: "Reclaimer: watching" in daemon.output(), timeout=60, what="the reclaim daemon polling")
    wait_for(lambda: len(client.xpending_range("idemonce", "r", "-", "+", 100)) == len(ids), timeout=60,
             what="every entry delivered")
    deadline = time.monotonic() + 6  # several pending timeouts: ~7 doublings of a 0.05 s back-off before the fix
    while time.monotonic() < deadline:
        rows = client.xpending_range("idemonce", "r", "-", "+", 100)
        assert len(rows) == len(ids) and all(r["times_delivered"] <= 1 for r in rows), rows  # none ran, none counted
        time.sleep(0.2)
    assert client.llen("started:idemonce:r") == 0  # nothing ran: Redis refused the marks
    client.config_set("maxmemory", "0")
    wait_for(lambda: client.xpending("idemonce", "r")["pending"] == 0, timeout=60, what="every entry run and acked")
    assert stop(worker, daemon) == [0, 0], [p.output() for p in (worker, daemon)]
    assert client.xlen("{idemonce}:dlq") == 0, client.xrange("{idemonce}:dlq")
    assert sorted(client.lrange("handled:idemonce:r", 0, -1)) == sorted(ids)  # each once


def test_a_dead_letter_move_refused_at_maxmemory_survives_a_group_recreated_by_another_consumer(redis_factory,
                                                                                                 run_consumer):
    """A poison entry's move is refused at maxmemory and waits in its consumer, which is busy (a 20 s
    handler, another waiting for the thread: no read) when the group is destroyed and Redis has room
    again; the idle consumer recreates the group at once, after what it read. Before the fix the busy
    one's next try (within a second) found the entry not pending, took it for moved by someone else and
    dropped it: neither dead-lettered nor pending (the 1-in-300 loss of docs/failures.md, 3 of 3 runs)."""
    server = redis_factory()
    client = server.client()
    poison = client.xadd("quiet", {"payload": "{not json"})
    for _ in range(2):  # one runs, one waits for the only thread: no slot left, so no read either
        client.xadd("quiet", {"payload": json.dumps({"sleep": 20})})
    later = [client.xadd("quiet", {"payload": json.dumps({"n": n})}) for n in range(3)]
    client.xgroup_create("quiet", "a", id="0")
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    streams = {"BATCH_SIZE": 1, "BLOCK_MS": 500}
    busy = run_consumer("quiet:a", "--threads", "1", server=server, streams=streams)
    wait_for(lambda: client.xpending("quiet", "a")["pending"] == 3 and "refuses writes" in busy.output(), timeout=60,
             what="the busy consumer holding the slow entries and the refused move")
    idle = run_consumer("quiet:a", "--threads", "1", server=server, streams=streams)
    wait_for(lambda: client.xinfo_groups("quiet")[0]["last-delivered-id"] == later[-1]
             and client.xpending("quiet", "a")["pending"] == 3 and reader_blocked(client), timeout=60,
             what="the idle consumer to read and ack the rest")
    pipe = client.pipeline(transaction=False)  # MULTI is refused at maxmemory; one round trip will do
    pipe.config_set("maxmemory", "0")  # room again, and the group gone, within a fraction of a millisecond
    pipe.xgroup_destroy("quiet", "a")
    pipe.execute()
    idle.wait_for_output("recreated at", timeout=30)
    assert stop(busy, idle) == [0, 0], [p.output() for p in (busy, idle)]
    dead = [fields["shoal:origin_id"] for _, fields in client.xrange("{quiet}:dlq")]
    pending = [row["message_id"] for row in client.xpending_range("quiet", "a", "-", "+", 10)]
    assert poison in dead + pending, f"lost: not dead-lettered, not pending ({dead}, {pending})"
    assert dead == [poison], (dead, pending)
    assert "another consumer recreated it first" in busy.output()


# -- 5. replay to a group that no longer exists --------------------------------------------------------

def test_replay_to_a_destroyed_group_is_refused_and_removes_nothing(redis, run_command):
    from streams_app.deadletters import store

    ids = [redis.xadd("jobs", {"payload": json.dumps({"n": n})}) for n in range(5)]
    for group in ("a", "b"):
        redis.xgroup_create("jobs", group, id="0")
        redis.xreadgroup(group, "ghost", {"jobs": ">"})
    store.move(redis, "jobs", "b", [(i, "E: b", "") for i in ids])
    redis.xgroup_destroy("jobs", "b")
    dlq_before, stream_before = redis.xrange("{jobs}:dlq"), redis.xrange("jobs")
    for selector in (["--all"], ["--id", *[i for i, _ in dlq_before[:2]]]):
        replay = run_command("replay", "jobs", "--group", "b", *selector)
        assert replay.wait(60) == 1, replay.output()
        assert "group 'b' does not exist on stream 'jobs'" in replay.output()
        assert "Nothing was replayed" in replay.output()
    assert redis.xrange("{jobs}:dlq") == dlq_before and redis.xrange("jobs") == stream_before


# -- entries Shoal did not write (issue 22) ------------------------------------------------------------

WIDE = 5000  # fields: more than one Lua unpack() can take (about 8,000 values)


def wide_entry(redis, stream, payload):
    fields = {"payload": payload, **{f"f{n}": str(n) for n in range(WIDE)}, "group": "theirs", "error": "theirs"}
    return redis.xadd(stream, fields), fields


def test_an_entry_with_thousands_of_fields_is_dead_lettered_whole_and_blocks_nothing(redis, run_command):
    """Before the fix dead_letter.lua failed with 'too many results to unpack' and the read loop crashed."""
    from streams_app.deadletters.store import get_dead_letters

    good = redis.xadd("jobs", {"payload": json.dumps({"n": 0})})
    wide, fields = wide_entry(redis, "jobs", "{not json")  # poison: dead-lettered at once
    later = redis.xadd("jobs", {"payload": json.dumps({"n": 1})})
    worker = run_command("runconsumer", "jobs:a")
    wait_for(lambda: redis.xlen("{jobs}:dlq") == 1 and redis.xpending("jobs", "a")["pending"] == 0
             and sorted(redis.lrange("handled:jobs:a", 0, -1)) == sorted([good, later]),
             timeout=60, what="the wide entry dead-lettered, the others handled")
    assert worker.proc.poll() is None, worker.output()
    assert stop(worker) == [0], worker.output()
    [letter] = get_dead_letters("jobs", [redis.xrange("{jobs}:dlq")[0][0]], conn=redis)
    assert letter.origin_id == wide and letter.group == "a" and letter.error.startswith("decode: ")
    assert letter.original_fields == fields  # every field, 'group' and 'error' included, as it was


def test_the_reclaim_daemon_moves_a_wide_entry_at_its_limit_and_counts_right(redis, run_command):
    ids = [redis.xadd("jobs", {"payload": json.dumps({"n": 0})})]
    ids.append(wide_entry(redis, "jobs", json.dumps({"n": 1}))[0])
    ids.append(redis.xadd("jobs", {"payload": json.dumps({"n": 2})}))
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "ghost", {"jobs": ">"})
    redis.xclaim("jobs", "a", "ghost", 0, ids, idle=60_000, retrycount=5, justid=True)  # all at the limit
    daemon = run_command("runreclaimer", "--once")
    assert daemon.wait(60) == 0, daemon.output()
    assert "moved 3 entries of jobs:a" in daemon.output()
    assert sorted(f["shoal:origin_id"] for _, f in redis.xrange("{jobs}:dlq")) == sorted(ids)
    assert redis.xpending("jobs", "a")["pending"] == 0


# -- least-privilege Redis users (issue 22) -------------------------------------------------------------

# The README's "Redis ACL" section. Least privilege: the categories Shoal's commands (and its Lua
# scripts' commands) belong to, nothing dangerous; +@list only for these tests' handlers (RPUSH).
LEAST_PRIVILEGE = ["on", ">s3cret", "~*", "&*", "-@all", "+@stream", "+@scripting", "+@string", "+@hash",
                   "+@set", "+@sortedset", "+@keyspace", "+@pubsub", "+@connection", "+time", "-@dangerous", "+@list"]
# A common hardened default (managed Redis services restrict similar commands).
HARDENED_DEFAULT = ["on", ">s3cret", "~*", "&*", "+@all", "-@dangerous"]


def acl_server(redis_factory, rules):
    server = redis_factory()
    server.client().acl_setuser("shoal", reset=True)
    server.client().execute_command("ACL", "SETUSER", "shoal", *rules)
    return server, f"redis://shoal:s3cret@127.0.0.1:{server.port}/0"


@pytest.mark.parametrize("rules", [LEAST_PRIVILEGE, HARDENED_DEFAULT], ids=["least-privilege", "hardened-default"])
def test_a_user_without_client_commands_stops_cleanly_and_takes_over_a_killed_consumer(redis_factory, run_consumer, rules,
                                                                                      database_url):  # noqa: F811
    """No CLIENT LIST/UNBLOCK: before the fix SIGTERM exited 1 (CLIENT LIST in unblock_readers) and a new
    consumer crashed once a killed one's liveness deadline lapsed (CLIENT LIST in _claim_from_dead)."""
    server, url = acl_server(redis_factory, rules)
    client = server.client()
    settings = {"PENDING_TIMEOUT_MS": 3000, "CLAIM_INTERVAL_MS": 200, "CONSUMER_TTL": 1, "BLOCK_MS": 2000}
    env = {"REDIS_URL": url, "DATABASE_URL": database_url[0]}
    entry = client.xadd("jobs", {"payload": json.dumps({"sleep": 60})})
    doomed = run_consumer("jobs:a", server=server, streams=settings, env=env)
    wait_for(lambda: client.llen("started:jobs:a") == 1, timeout=60, what="the doomed handler started")
    doomed.kill()
    heir = run_consumer("jobs:a", server=server, streams=settings, env=env)
    wait_for(lambda: client.llen("started:jobs:a") == 2, timeout=60, what="the entry taken over after the pending timeout")
    assert "may not run CLIENT LIST/CLIENT UNBLOCK" in heir.output()  # said once, at start
    [row] = client.xpending_range("jobs", "a", "-", "+", 1)
    # Its death was not charged (it was not a suspect's run alone): the count is the charged runs + 1.
    assert row["message_id"] == entry and row["times_delivered"] == 1
    assert heir.proc.poll() is None, heir.output()
    heir.signal(signal.SIGTERM)  # a 60 s handler: the stop waits for the shutdown timeout, not for ever
    idle = run_consumer("noop:bench", server=server, streams=settings, env=env)
    idle.wait_for_output("started", timeout=60)
    wait_for(lambda: reader_blocked(client), timeout=30, what="the idle consumer blocked in XREADGROUP")
    idle.signal(signal.SIGTERM)
    assert idle.wait(30) == 0, idle.output()  # the short blocking read ends by itself
    heir.signal(signal.SIGTERM)  # second signal: exit at once
    assert heir.wait(30) == 2, heir.output()
    daemon = run_consumer("--once", server=server, streams=settings, env=env, command="runreclaimer")
    assert daemon.wait(60) == 0, daemon.output()  # a whole pass: audit, clean-up, snapshots, mirror
    assert "NOPERM" not in "".join(p.output() for p in (doomed, heir, idle, daemon))
