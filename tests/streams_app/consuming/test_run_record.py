"""The run ledger's writes (streams_app/consuming/runs.py, issue 36): one per read, and the ends of chunks
ride with the acks. Written per chunk from each handler thread, the ledger cost a no-op consumer 30% of
its throughput (bench/README.md, "The run ledger, written by the read loop")."""
import socket

import redis as redis_lib

from streams_app import publish_many
from streams_app.redis.keys import running_key
from tests.streams_app.consuming.loops import make_loop, run_until, settled  # noqa: F401


def _calls(stats, name):
    return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))


def test_a_read_is_recorded_in_one_write_whatever_its_chunks(redis, make_loop):
    publish_many("jobs", [{"n": n} for n in range(300)])
    # Four threads, reads of 100: every read is cut into several chunks (one message each at first,
    # until the loop has measured the handlers).
    loop = make_loop(threads=4, BATCH_SIZE=100, CLAIM_INTERVAL_MS=600_000)
    loop.tick()  # creates the group, makes the one claim pass, reads
    redis.config_resetstat()
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 300 and settled(loop))
    stats = redis.info("commandstats")
    reads, acks = _calls(stats, "xreadgroup"), _calls(stats, "xack")
    marks, ends = _calls(stats, "evalsha"), _calls(stats, "hdel")
    # Before: one runs_mark and one HDEL per chunk (over 100 each here: the first read ran one message
    # per chunk). Now one mark per read, and the HDELs ride in the acks' round trips.
    assert marks <= reads and ends <= acks, (reads, acks, marks, ends)
    assert redis.hgetall(running_key("jobs", "a", "me")) == {"-": ""}  # every chunk's field left with its acks


def test_entries_waiting_for_a_thread_are_recorded(redis, make_loop):
    # They were handed to the pool: should the process die now they are suspects (run alone, charged
    # nothing), not ordinary pending entries run again in a chunk beside others.
    ids = publish_many("jobs", [{"n": n, "sleep": 0.5} for n in range(4)])
    loop = make_loop(threads=1, BATCH_SIZE=4, CLAIM_INTERVAL_MS=600_000)
    run_until(loop, lambda: redis.llen("started:jobs:a") == 1)
    recorded = {i for field, value in redis.hgetall(running_key("jobs", "a", "me")).items() if field != "-"
                for i in value.split(",")}
    held = {row["message_id"] for row in redis.xpending_range("jobs", "a", "-", "+", 10)}
    # A read takes twice the threads: one runs, one waits for the thread; both recorded.
    assert len(held) == 2 and recorded == held and redis.lrange("started:jobs:a", 0, -1) == ids[:1]
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 4 and settled(loop))
    assert redis.hgetall(running_key("jobs", "a", "me")) == {"-": ""}


def _unused_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_ends_not_sent_for_redis_trouble_go_with_the_next_acks(redis, make_loop):
    publish_many("jobs", [{"n": n} for n in range(10)])
    loop = make_loop(threads=1, BATCH_SIZE=10, CLAIM_INTERVAL_MS=600_000)
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 10 and not loop.in_flight)
    loop.collect()
    conn = loop.conn
    loop.conn = redis_lib.Redis(port=_unused_port(), socket_connect_timeout=1)  # nothing listens there
    if not loop.to_ack:  # acked with its read already: hand the loop an end to send
        loop.runs.ended("0-1")
        redis.hset(running_key("jobs", "a", "me"), "0-1", "0-1")
    try:
        loop.flush_acks()
    except redis_lib.ConnectionError:
        pass
    else:
        raise AssertionError("flush_acks reached a port nobody listens on")
    assert loop.runs.has_ended()  # kept for the next round trip, not dropped
    loop.conn = conn
    loop.flush_acks()
    assert not loop.runs.has_ended() and not loop.to_ack
    assert redis.hgetall(running_key("jobs", "a", "me")) == {"-": ""}


def test_a_chunk_s_record_leaves_in_the_round_trip_of_its_own_acks(redis, make_loop):
    # Its field must not go before its acks (a death in between would leave its entries pending and no
    # longer suspects): the read loop queues the HDEL when it takes the chunk's acks.
    publish_many("jobs", [{"n": n} for n in range(300)])
    loop = make_loop(threads=4, BATCH_SIZE=50, CLAIM_INTERVAL_MS=600_000)
    sent = []  # (acked ids, deleted fields) of each pipeline

    def spied(make):
        def pipeline(*args, **options):
            pipe = make(*args, **options)
            execute = pipe.execute

            def counted(**kwargs):
                acked = {str(a) for args, _ in pipe.command_stack if args[0] == "XACK" for a in args[3:]}
                fields = [str(a) for args, _ in pipe.command_stack if args[0] == "HDEL" for a in args[2:]]
                sent.append((acked, fields))
                return execute(**kwargs)

            pipe.execute = counted
            return pipe
        return pipeline

    loop.reader.pipeline = spied(loop.reader.pipeline)
    loop.conn.pipeline = spied(loop.conn.pipeline)
    try:
        run_until(loop, lambda: redis.llen("handled:jobs:a") == 300 and settled(loop))
    finally:
        del loop.conn.pipeline  # the shared client goes back to its class's pipeline
    deleted = [f for _, fields in sent for f in fields]
    assert len(deleted) >= 300 // 50  # at least one chunk per read
    assert all(set(fields) <= acked for acked, fields in sent), [(sorted(a)[:3], f) for a, f in sent if not set(f) <= a]


def test_a_clean_leave_deletes_the_running_record(redis, make_loop):
    publish_many("jobs", [{"n": n} for n in range(20)])
    loop = make_loop(CLAIM_INTERVAL_MS=600_000)
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 20 and settled(loop))
    assert redis.exists(running_key("jobs", "a", "me"))
    assert loop.leave()
    assert not redis.exists(running_key("jobs", "a", "me"))  # before: one key per process start, for a week


def _count(redis, entry_id):
    [row] = redis.xpending_range("sleepy", "a", entry_id, entry_id, 1)
    return row["times_delivered"]


def _at_maxmemory(redis):
    redis.config_set("maxmemory-policy", "noeviction")
    redis.config_set("maxmemory", "1")


def test_at_maxmemory_a_consumer_with_a_record_charges_only_the_entry_running(redis, make_loop):
    ids = publish_many("sleepy", [{"sleep": 1} for _ in range(2)])
    redis.xgroup_create("sleepy", "a", id="0")
    loop = make_loop("sleepy:a", threads=1, BATCH_SIZE=2, CLAIM_INTERVAL_MS=600_000)
    loop.runs.begin()  # the record exists: the consumer started before Redis filled up
    loop.chunk_size = 2  # as after fast handlers: a read would go out as one chunk of both
    _at_maxmemory(redis)
    try:
        run_until(loop, lambda: _count(redis, ids[0]) == 2 if loop.chunks else False)  # charged as it runs
        # The entry waiting for the thread is charged nothing: at maxmemory chunks hold one entry each
        # (before: one chunk of both, both charged).
        assert len(loop.chunks) == 2 and _count(redis, ids[1]) == 1
        run_until(loop, lambda: _count(redis, ids[0]) == 1 if redis.xpending("sleepy", "a")["pending"] == 2 else True)
    finally:
        redis.config_set("maxmemory", "0")
    run_until(loop, lambda: redis.xpending("sleepy", "a")["pending"] == 0 and settled(loop))


def test_at_maxmemory_a_consumer_without_a_record_leaves_redis_counts_alone(redis, make_loop):
    # It started at maxmemory: no record, so a takeover charges it by Redis's counts (take_over_runs.lua).
    # Raising them as well charged each death twice (a user trial: a killer dead-lettered after two runs
    # at max_deliveries 3, and a neighbour that had succeeded with it).
    [entry] = publish_many("sleepy", [{"sleep": 1}])
    redis.xgroup_create("sleepy", "a", id="0")
    _at_maxmemory(redis)
    loop = make_loop("sleepy:a", threads=1, BATCH_SIZE=1, CLAIM_INTERVAL_MS=600_000)
    try:
        run_until(loop, lambda: bool(loop.chunks))
        assert not loop.runs.has_record and not redis.exists(running_key("sleepy", "a", "me"))
        while loop.chunks:
            assert _count(redis, entry) == 1
            loop.tick()
    finally:
        redis.config_set("maxmemory", "0")
    run_until(loop, lambda: redis.xpending("sleepy", "a")["pending"] == 0 and settled(loop))


def test_a_suspect_the_guard_refuses_stays_a_suspect(redis, make_loop):
    # Taken over from a dead consumer as a suspect; its redis-guard mark names another consumer (an earlier
    # holder, not known dead here), so the guard refuses it and no handler runs. It must stay a suspect,
    # in this loop and in its record: before, it ran later in an ordinary chunk, where a death is charged
    # to nobody (a user trial: killers ran 3 and 4 times at max_deliveries 1).
    from streams_app import publish

    entry = publish("idem", {"n": 1}, key="order-s")
    redis.xgroup_create("idem", "r", id="0")
    redis.xreadgroup("r", "me", {"idem": ">"})
    redis.set("{idem}:idem:r:order-s", f"running:earlier:{entry}", px=60_000)
    record = running_key("idem", "r", "me")
    redis.hset(record, mapping={"-": "", entry: entry})  # as take_over_runs.lua writes a claimed suspect
    loop = make_loop("idem:r", threads=1, CLAIM_INTERVAL_MS=600_000)
    loop.tick()  # ready; nothing new to read
    [(_, fields)] = loop.reader.xrange("idem", entry, entry)
    loop.suspects.add(entry)
    loop.dispatch([(entry, fields, 1)])
    run_until(loop, lambda: loop.retries)
    assert redis.llen("started:idem:r") == 0  # refused: nothing ran
    assert entry in loop.suspects
    assert redis.hget(record, entry) == entry  # still recorded, not as running alone
