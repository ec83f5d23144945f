"""One read loop driven pass by pass (``tick``) against a real Redis, in this process."""
import time

import pytest

from streams_app import publish, publish_many
from streams_app.redis.connection import get_connection, node_client
from streams_app.consuming.groups import ensure_group
from tests.streams_app.consuming.loops import make_loop, run_until, settled  # noqa: F401  (make_loop is a fixture)
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis


def test_handles_and_acks_in_batches(redis, make_loop):
    node = node_client(redis, "jobs")  # command statistics are per node
    node.config_resetstat()
    publish_many("jobs", [{"n": n} for n in range(300)])
    loop = make_loop(BATCH_SIZE=100)
    loop.chunk_budget = 600  # no chunk is cut short under load: each round below collects whole chunks

    def xack_calls():
        return int(node.info("commandstats").get("cmdstat_xack", {}).get("calls", 0))

    # Round by round: dispatch, let every chunk in flight finish, then one tick collects them all.
    # How many messages a round holds depends on the machine (the chunk size adapts to handler
    # speed); that the round's acks go out as one XACK does not.
    rounds = []
    deadline = time.monotonic() + 120
    while redis.llen("handled:jobs:a") < 300:
        assert time.monotonic() < deadline, "the loop did not handle 300 messages in time"
        loop.tick()
        chunks, messages = len(loop.chunks), len(loop.in_flight)
        wait_for(lambda: loop.completions.qsize() == len(loop.chunks), timeout=60, what="the round's chunks finished")
        before = xack_calls()
        loop.collect()
        loop.flush_acks()
        rounds.append((chunks, messages, xack_calls() - before))
    assert redis.xpending("jobs", "a")["pending"] == 0
    assert sorted(redis.lrange("handled:jobs:a", 0, -1)) == sorted(e[0] for e in redis.xrange("jobs"))
    # Every round of finished chunks is acked with exactly one XACK, however many chunks and messages it had.
    assert all(xacks == (1 if messages else 0) for _, messages, xacks in rounds), rounds
    assert any(chunks > 1 for chunks, _, _ in rounds), rounds  # several chunks shared one XACK
    assert xack_calls() < 300  # so: fewer XACKs than messages, whatever the load


def test_failure_stays_pending_and_does_not_block_the_rest(redis, make_loop):
    ids = [publish("jobs", {"fail": "boom"}), publish("jobs", {"n": 1}), publish("jobs", {"n": 2})]
    loop = make_loop()
    # settled: the two successes acked too (they may wait in to_ack for the next tick's flush; CI saw it).
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 2 and settled(loop))
    assert sorted(redis.lrange("handled:jobs:a", 0, -1)) == ids[1:]  # handler threads finish in any order
    pending = redis.xpending_range("jobs", "a", "-", "+", 10)
    assert [p["message_id"] for p in pending] == [ids[0]]


DEEP = 200_000


def test_a_payload_nested_too_deeply_to_decode_is_poison_and_its_neighbours_run(redis, make_loop):
    before = publish("jobs", {"n": 1})
    # Another producer's; deeper than the json module parses on every supported Python (3.11 stops near
    # 1,000 levels, 3.13 near 50,000).
    deep = redis.xadd("jobs", {"payload": '{"v":' + "[" * DEEP + "1" + "]" * DEEP + "}"})
    after = publish("jobs", {"n": 2})
    loop = make_loop()
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 2 and redis.xlen("{jobs}:dlq") == 1)
    assert sorted(redis.lrange("handled:jobs:a", 0, -1)) == sorted([before, after])
    [(_, letter)] = redis.xrange("{jobs}:dlq")
    assert letter["shoal:origin_id"] == deep and letter["shoal:deliveries"] == "1"
    assert letter["shoal:error"].startswith("decode: ") and "nested too deeply" in letter["shoal:error"]


def test_publishing_a_payload_nested_too_deeply_is_a_publish_error():
    from streams_app.exceptions import PublishError

    payload = current = {}
    for _ in range(DEEP):
        current["v"] = current = {}
    with pytest.raises(PublishError, match="nested too deeply"):
        publish("jobs", payload)


def test_poison_payload_does_not_block_the_rest(redis, make_loop):
    bad = redis.xadd("jobs", {"payload": "{not json"})
    raw = get_connection()
    not_utf8 = raw.xadd("jobs", {b"payload": b"\xff\xfe"}).decode()
    good = publish("jobs", {"n": 1})
    loop = make_loop()
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 1 and not loop.in_flight)
    assert redis.lrange("handled:jobs:a", 0, -1) == [good]
    assert redis.llen("started:jobs:a") == 1  # the handler never saw the poison entries
    # Poison goes to the dead-letter stream after one delivery, with no retries.
    run_until(loop, lambda: redis.xlen("{jobs}:dlq") == 2)
    assert redis.xpending("jobs", "a")["pending"] == 0
    letters = {f[b"shoal:origin_id"].decode(): f for _, f in raw.xrange("{jobs}:dlq")}  # raw: one payload is not UTF-8
    assert set(letters) == {bad, not_utf8}
    assert letters[not_utf8][b"payload"] == b"\xff\xfe"  # kept byte for byte
    assert all(f[b"shoal:error"].startswith(b"decode: ") and f[b"shoal:deliveries"] == b"1" for f in letters.values())


def test_data_field_is_accepted_as_payload(redis, make_loop):
    entry = redis.xadd("jobs", {"data": '{"from": "an older producer"}'})
    loop = make_loop()
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 1)
    assert redis.lrange("handled:jobs:a", 0, -1) == [entry]


def test_takes_over_entries_of_a_dead_consumer(redis, make_loop):
    ids = publish_many("jobs", [{"n": n} for n in range(5)])
    loop = make_loop(PENDING_TIMEOUT_MS=200, CLAIM_INTERVAL_MS=50)
    redis.xgroup_create("jobs", "a", id="0")
    # A consumer that read everything and died.
    assert len(redis.xreadgroup("a", "ghost", {"jobs": ">"})[0][1]) == 5
    loop.tick()
    assert redis.llen("handled:jobs:a") == 0  # not idle long enough yet
    time.sleep(0.25)  # the entries must age past the pending timeout
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 5 and not loop.to_ack and not loop.in_flight)
    assert sorted(redis.lrange("handled:jobs:a", 0, -1)) == sorted(ids)
    assert redis.xpending("jobs", "a")["pending"] == 0


def test_takeover_reports_deliveries_and_skips_deleted_entries(redis, make_loop):
    seen = []
    ids = publish_many("jobs", [{"n": n} for n in range(3)])
    loop = make_loop(PENDING_TIMEOUT_MS=100, CLAIM_INTERVAL_MS=50)
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "ghost", {"jobs": ">"})
    redis.xdel("jobs", ids[1])
    time.sleep(0.15)
    original = loop.spec.handler
    object.__setattr__(loop.spec, "handler", lambda m: (seen.append((m.id, m.deliveries)), original(m)))
    try:
        run_until(loop, lambda: redis.llen("handled:jobs:a") == 2 and not loop.to_ack and not loop.in_flight)
    finally:
        object.__setattr__(loop.spec, "handler", original)
    assert sorted(seen) == [(ids[0], 2), (ids[2], 2)]
    assert redis.xpending("jobs", "a")["pending"] == 0


def test_own_failed_entries_are_retried_at_the_next_claim_pass(redis, make_loop):
    entry = publish("jobs", {"n": 1})
    loop = make_loop(CLAIM_INTERVAL_MS=100)
    calls = []
    original = loop.spec.handler

    def flaky(message):
        calls.append(message.deliveries)
        if len(calls) == 1:
            raise RuntimeError("first time fails")
        original(message)

    object.__setattr__(loop.spec, "handler", flaky)
    try:
        run_until(loop, lambda: redis.llen("handled:jobs:a") == 1 and not loop.to_ack and not loop.in_flight)
    finally:
        object.__setattr__(loop.spec, "handler", original)
    assert redis.lrange("handled:jobs:a", 0, -1) == [entry]
    assert calls == [1, 2]  # reading its own PEL counts as a delivery
    assert redis.xpending("jobs", "a")["pending"] == 0


def test_group_is_recreated_when_redis_loses_it(redis, make_loop):
    loop = make_loop()
    loop.tick()
    redis.flushall()
    publish("jobs", {"n": 1})
    wait_for(lambda: (loop.step() or redis.llen("handled:jobs:a") == 1), timeout=10, what="handled after FLUSHALL")


def test_a_consumer_too_busy_to_read_notices_at_its_keep_alive_that_another_recreated_its_lost_group(
        redis, make_loop):
    """Its threads run slow handlers, so the busy consumer does not read and gets no NOGROUP; the idle
    one finds the group destroyed and recreates it at the start (it read nothing). Before the fix only
    the busy one's next read (when its handlers end) made it notice: past the settling time the other
    would have been handed the running entries again. Its keep-alive now finds them no longer pending
    while the settling marker lives: it moves the group to what it read and holds them again."""
    # Two threads, four chunks (two running, two queued behind them): every slot taken, no read.
    ids = [publish("jobs", {"sleep": 8 if n < 2 else 0, "n": n}) for n in range(4)]
    busy = make_loop("jobs:a", name="busy", threads=2, PENDING_TIMEOUT_MS=400)  # a keep-alive every 0.1 s
    run_until(busy, lambda: busy.in_flight == set(ids))
    other = make_loop("jobs:a", name="other", PENDING_TIMEOUT_MS=400)
    other.tick()
    redis.xgroup_destroy("jobs", "a")
    wait_for(lambda: other.step() or redis.exists(other.settling), timeout=10, what="the group recreated by the other")
    assert redis.xinfo_groups("jobs")[0]["last-delivered-id"] == "0-0"

    wait_for(lambda: moved_and_held(redis, busy, ids), timeout=6, what="the busy consumer to move the group to what it read")
    assert busy.in_flight == set(ids)  # noticed while its handlers still run, not at its next read


def moved_and_held(redis, busy, ids):
    busy.step()
    [group] = redis.xinfo_groups("jobs")
    held = {row["message_id"] for row in redis.xpending_range("jobs", "a", "-", "+", 10, consumername="busy")}
    return group["last-delivered-id"] == ids[-1] and held == set(ids)


def test_a_group_a_starting_consumer_recreates_settles_so_that_a_busy_consumer_moves_it_to_what_it_read(
        redis, make_loop):
    """Found by a user trial: a consumer started while the group was gone created it at "0" with nothing
    to tell the busy ones, and the entries they had read were delivered again (in ordered mode, a whole
    partition re-run out of order). A group the stream had before is now created settling."""
    ids = [publish("jobs", {"sleep": 8 if n < 2 else 0, "n": n}) for n in range(4)]
    busy = make_loop("jobs:a", name="busy", threads=2, PENDING_TIMEOUT_MS=400)  # a keep-alive every 0.1 s
    run_until(busy, lambda: busy.in_flight == set(ids))
    redis.xgroup_destroy("jobs", "a")
    assert ensure_group(get_connection(), "jobs", "a", "0")  # what a starting consumer's boot does
    assert redis.exists(busy.settling)
    wait_for(lambda: moved_and_held(redis, busy, ids), timeout=6, what="the busy consumer to move the group to what it read")
    assert busy.in_flight == set(ids)


def test_a_new_group_does_not_settle(redis):
    publish("jobs", {"n": 1})
    assert ensure_group(get_connection(), "jobs", "a", "0")
    assert not redis.exists("{jobs}:settling:a")
    assert redis.smembers("{jobs}:groups") == {"a"}


def test_a_lost_group_with_a_retry_scheduled_is_recreated_not_a_crash(redis, make_loop):
    # The retry's XCLAIM goes through a pipeline, whose errors redis-py words differently.
    publish("jobs", {"fail": "once"})
    loop = make_loop(RETRY_BACKOFF=0.05)
    run_until(loop, lambda: loop.retries)
    redis.flushall()
    entry = publish("jobs", {"n": 1})
    wait_for(lambda: (loop.step() or redis.lrange("handled:jobs:a", 0, -1) == [entry]), timeout=10,
             what="handled after the group was recreated")


def test_a_slow_chunk_hands_back_what_it_has_not_started(redis, make_loop):
    from tests.streams_app.consuming.loops import settled

    ids = publish_many("jobs", [{"n": n, "sleep": 0.02} for n in range(30)])
    loop = make_loop(threads=1, PENDING_TIMEOUT_MS=1000)  # chunk budget 0.1 s
    loop.chunk_size = 30  # as if the handler had been fast until now
    handed_back = []
    submit = loop._submit
    loop._submit = lambda messages: (handed_back.append(len(messages)), submit(messages))
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 30 and settled(loop))
    assert sorted(redis.lrange("handled:jobs:a", 0, -1)) == sorted(ids)  # each exactly once
    assert handed_back and handed_back[1] < 30, handed_back  # the first chunk stopped early
    assert redis.xpending("jobs", "a")["pending"] == 0


def test_a_clean_stop_removes_the_consumer_from_its_group(redis, make_loop):
    publish_many("jobs", [{"n": n} for n in range(20)])
    loop = make_loop(name="leaving")
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 20 and not loop.in_flight)
    assert [c["name"] for c in redis.xinfo_consumers("jobs", "a")] == ["leaving"]
    loop.shutdown.set()
    loop.drain()
    assert redis.xinfo_consumers("jobs", "a") == []
    assert redis.xpending("jobs", "a")["pending"] == 0


def test_a_consumer_holding_entries_stays_in_its_group_when_it_stops(redis, make_loop):
    failed = publish("jobs", {"fail": "boom"})
    loop = make_loop(name="holding")
    run_until(loop, lambda: loop.retries and not loop.in_flight)  # failed once, waiting for its retry
    loop.shutdown.set()
    loop.drain()
    # Removing it would drop the failed entry from the PEL: it stays for another consumer to take over.
    [consumer] = redis.xinfo_consumers("jobs", "a")
    assert consumer["name"] == "holding" and consumer["pending"] == 1
    assert [p["message_id"] for p in redis.xpending_range("jobs", "a", "-", "+", 10)] == [failed]


def _dead_setup(redis, holder, n=3):
    redis.xgroup_create("jobs", "a", id="0", mkstream=True)
    ids = publish_many("jobs", [{"n": i} for i in range(n)])
    redis.xreadgroup("a", holder, {"jobs": ">"})
    redis.hset("{jobs}:consumers", holder, 1)  # its liveness deadline lapsed long ago
    return ids


def test_a_consumer_whose_deadline_lapsed_but_whose_connection_lives_is_not_taken_over(redis, redis_server, make_loop):
    # Frozen (SIGSTOP, a GIL-holding handler, a paused VM) rather than dead: its sockets stay open.
    frozen = redis_server.client(client_name="shoal-reader:frozen")
    frozen.exists("jobs")  # connected where its reader would block: the node that holds the stream
    ids = _dead_setup(redis, "frozen")
    loop = make_loop(PENDING_TIMEOUT_MS=600_000, CLAIM_INTERVAL_MS=10, RETRY_BACKOFF=0.01)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # many claim passes
        loop.tick()
    assert redis.llen("started:jobs:a") == 0, "took entries from a consumer that is still connected"
    frozen.close()  # now it is really gone
    run_until(loop, lambda: sorted(redis.lrange("handled:jobs:a", 0, -1)) == sorted(ids))


def test_stale_names_do_not_crowd_out_a_dead_consumer_holding_entries(redis, make_loop):
    redis.hset("{jobs}:consumers", mapping={f"gone-{i:02d}": 1 for i in range(12)})  # dead, holding nothing
    ids = _dead_setup(redis, "zz-dead")
    loop = make_loop(PENDING_TIMEOUT_MS=600_000, CLAIM_INTERVAL_MS=10, RETRY_BACKOFF=0.01)
    run_until(loop, lambda: sorted(redis.lrange("handled:jobs:a", 0, -1)) == sorted(ids))


def test_an_entry_running_here_is_not_claimed_back_from_whoever_took_it(redis, make_loop):
    entry = publish("jobs", {"n": 1, "sleep": 1.0})
    loop = make_loop(threads=1, PENDING_TIMEOUT_MS=200, CLAIM_INTERVAL_MS=20, RETRY_BACKOFF=0.01)
    run_until(loop, lambda: redis.llen("started:jobs:a") == 1)
    redis.xclaim("jobs", "a", "other", 0, [entry])  # another consumer took it over meanwhile
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 1 and not loop.in_flight)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        loop.tick()
    assert redis.llen("started:jobs:a") == 1, "this process ran the entry a second time"


def test_keep_alive_resets_the_idle_time_of_held_entries_only_while_this_consumer_owns_them(redis, make_loop):
    """What a live worker holds never looks idle; an entry another consumer took over meanwhile (this one
    was frozen) is not claimed back, and no delivery is counted."""
    from streams_app.consuming.loop import KEEP_ALIVE_FRACTION

    ids = [publish("jobs", {"n": n, "sleep": 3}) for n in range(2)]
    loop = make_loop(threads=2, PENDING_TIMEOUT_MS=400 * KEEP_ALIVE_FRACTION)
    run_until(loop, lambda: redis.llen("started:jobs:a") == 2)
    redis.xclaim("jobs", "a", "other", 0, [ids[1]])  # taken over while this loop still runs it
    time.sleep(0.5)  # both entries idle past one keep-alive period
    loop.keep_alive(loop.clock())
    rows = {r["message_id"]: r for r in redis.xpending_range("jobs", "a", "-", "+", 10)}
    assert rows[ids[0]]["consumer"] == "me" and rows[ids[0]]["time_since_delivered"] < 300
    assert rows[ids[0]]["times_delivered"] == 1
    assert rows[ids[1]]["consumer"] == "other" and rows[ids[1]]["time_since_delivered"] >= 500
    run_until(loop, lambda: settled(loop), timeout=30)


def test_on_one_server_a_read_carries_the_acks_due_and_the_settling_check_in_its_round_trip(redis, redis_kind, make_loop,
                                                                                             monkeypatch):
    if redis_kind == "cluster":
        pytest.skip("on a cluster the read goes through the cluster client, which follows moved slots")
    publish_many("jobs", [{"n": n} for n in range(200)])
    loop = make_loop(BATCH_SIZE=50)
    sent = []  # the commands of each pipeline the reader sent

    def pipeline(real=loop.reader.pipeline, **options):
        pipe = real(**options)
        execute = pipe.execute

        def counted(**kwargs):
            sent.append([args[0] for args, _ in pipe.command_stack])
            return execute(**kwargs)

        pipe.execute = counted
        return pipe

    def separate_exists(*args):
        raise AssertionError("the settling marker was checked in a round trip of its own")

    monkeypatch.setattr(loop.reader, "pipeline", pipeline)
    monkeypatch.setattr(loop.conn, "exists", separate_exists)
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 200 and settled(loop))
    loop.tick()  # nothing new: the last read
    assert redis.xpending("jobs", "a")["pending"] == 0
    assert sent and all(commands[-2:] == ["XREADGROUP", "EXISTS"] for commands in sent), sent
    # Acks finished while the loop went on reading were sent ahead of the next read, not on their own,
    # with their chunks' leaving the run ledger's record (runs.py).
    assert any(commands == ["XACK", "HDEL", "XREADGROUP", "EXISTS"] for commands in sent), sent


def test_a_handler_asking_for_longer_chunks_gets_them_and_a_short_read_still_spreads(redis, make_loop):
    loop = make_loop(threads=4)
    loop.chunk_seconds = 0.02  # as the task runner's QueueHandler asks (shoal_chunk_seconds)
    loop._adapt_chunk(0.001)
    assert loop.chunk_size == 20  # 1 ms handlers: 5 per chunk with the default target
    sizes = []
    run_chunk = loop.run_chunk
    loop.run_chunk = lambda handler, chunk, *rest: (sizes.append(len(chunk)), run_chunk(handler, chunk, *rest))[1]
    publish_many("jobs", [{"n": n} for n in range(8)])
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 8 and settled(loop))
    assert sum(sizes) == 8 and max(sizes) <= 2, sizes  # a read of 8 over four threads, not one chunk of 8
