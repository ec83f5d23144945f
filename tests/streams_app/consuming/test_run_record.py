"""The run ledger's writes (streams_app/consuming/runs.py, issue 36): one per read, and the ends of chunks
ride with the acks. Written per chunk from each handler thread, the ledger cost a no-op consumer 30% of
its throughput (bench/README.md, "The run ledger, written by the read loop")."""
import socket

import redis as redis_lib

from streams_app import publish_many
from streams_app.keys import running_key
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
