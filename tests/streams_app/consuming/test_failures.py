"""Retries with back-off, dead letters, takeover back-off, idempotency and replay, in this process."""
import json
import time

import pytest
from redis.exceptions import ResponseError
from django.core.management import CommandError, call_command

from streams_app import publish, publish_many
from streams_app.redis.connection import get_connection
from streams_app.deadletters.store import dead_letter_count, dead_letters, delete_dead_letters, move
from streams_app.exceptions import ConsumerConfigError, ReplayError
from streams_app.registry import consumer
from streams_app.deadletters.replay import replay
from streams_app.consuming.retry import backoff_seconds
from tests.streams_app.consuming.loops import make_loop, run_until, settled  # noqa: F401
from tests.testapp.consumers import FAILING_CALLS
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis


def test_backoff_doubles_and_is_capped():
    assert [backoff_seconds(d, 1.0, 10.0) for d in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert backoff_seconds(10_000, 1.0, 60.0) == 60.0


def test_always_failing_handler_is_delivered_max_times_with_growing_gaps_then_dead_lettered(redis, make_loop):
    FAILING_CALLS.clear()
    entry = publish("failing", {"order": 7}, key="order-7")
    loop = make_loop("failing:g", CLAIM_INTERVAL_MS=50)
    run_until(loop, lambda: redis.xlen("{failing}:dlq") == 1 and settled(loop))
    calls = [c for c in FAILING_CALLS if c[0] == entry]
    assert [d for _, d, _ in calls] == [1, 2, 3, 4]  # exactly max_deliveries, counted by Redis
    gaps = [b[2] - a[2] for a, b in zip(calls, calls[1:])]
    # Each retry waits at least its back-off (0.2 s doubling): a lower bound, so no timing luck.
    for gap, delivery in zip(gaps, (1, 2, 3)):
        assert gap >= backoff_seconds(delivery, 0.2, 5) - 0.01, gaps
    assert redis.xpending("failing", "g")["pending"] == 0
    [(dead_id, fields)] = redis.xrange("{failing}:dlq")
    assert fields["shoal:origin_stream"] == "failing" and fields["shoal:origin_id"] == entry
    assert fields["shoal:group"] == "g" and fields["shoal:consumer"] == "me" and fields["shoal:deliveries"] == "4"
    assert fields["shoal:error"] == "ValueError: cannot handle {'order': 7}"
    assert "raise ValueError" in fields["shoal:traceback"] and fields["shoal:failed_at"].isdigit()
    assert fields["payload"] == '{"order":7}' and fields["key"] == "order-7"  # original fields kept
    assert redis.keys("{failing}:error:*") == []  # the last-error record went with the move
    for _ in range(5):
        loop.tick()
    assert len([c for c in FAILING_CALLS if c[0] == entry]) == 4  # never delivered again


def test_failure_records_last_error_with_a_ttl(redis, make_loop):
    entry = publish("failing", {"n": 1})
    loop = make_loop("failing:g", RETRY_BACKOFF_MAX=60, ERROR_TTL=120)
    run_until(loop, lambda: redis.exists(f"{{failing}}:error:g:{entry}"))
    record = redis.hgetall(f"{{failing}}:error:g:{entry}")
    assert record["error"].startswith("ValueError: cannot handle") and record["consumer"] == "me"
    assert 0 < redis.ttl(f"{{failing}}:error:g:{entry}") <= 120


def test_takeover_waits_for_the_backoff_of_an_abandoned_entry(redis, make_loop):
    """An entry that died on its 2nd delivery is claimed only after max(pending timeout, 20 s)."""
    entry = publish("jobs", {"n": 1})
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "ghost", {"jobs": ">"})
    redis.xclaim("jobs", "a", "ghost", 0, [entry], idle=1500, retrycount=2)
    # A back-off far from the entry's idle time: the ticks below may take seconds on a loaded machine.
    loop = make_loop(PENDING_TIMEOUT_MS=100, CLAIM_INTERVAL_MS=10, RETRY_BACKOFF=10.0)
    for _ in range(5):
        loop.tick(now=loop.next_claim + 1)  # every tick is a claim pass
    assert redis.llen("started:jobs:a") == 0  # idle 1.5 s: past the pending timeout, not the back-off
    [row] = redis.xpending_range("jobs", "a", "-", "+", 10)
    assert row["consumer"] == "ghost" and row["times_delivered"] == 2
    redis.xclaim("jobs", "a", "ghost", 0, [entry], idle=20_100, retrycount=2)
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 1 and settled(loop))
    assert redis.xpending("jobs", "a")["pending"] == 0


def test_abandoned_entry_over_the_limit_is_dead_lettered_by_the_loop(redis, make_loop):
    entry = publish("jobs", {"n": 1})
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "ghost", {"jobs": ">"})
    redis.xclaim("jobs", "a", "ghost", 0, [entry], idle=60_000, retrycount=5)
    redis.hset(f"{{jobs}}:error:a:{entry}", mapping={"error": "KeyError: 'sku'", "traceback": "tb"})
    loop = make_loop(PENDING_TIMEOUT_MS=100, CLAIM_INTERVAL_MS=10)
    run_until(loop, lambda: redis.xlen("{jobs}:dlq") == 1)
    [(_, fields)] = redis.xrange("{jobs}:dlq")
    assert fields["shoal:error"] == "KeyError: 'sku'" and fields["shoal:consumer"] == "ghost" and fields["shoal:deliveries"] == "5"
    assert redis.llen("started:jobs:a") == 0 and redis.xpending("jobs", "a")["pending"] == 0


def test_dead_letter_move_is_exactly_once_and_skips_acked_entries(redis):
    ids = publish_many("jobs", [{"n": n} for n in range(3)])
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "ghost", {"jobs": ">"})
    redis.xack("jobs", "a", ids[2])
    conn = get_connection()
    first = move(conn, "jobs", "a", [(i, "E: x", "") for i in ids])
    again = move(conn, "jobs", "a", [(i, "E: x", "") for i in ids])
    assert [i for i, _ in first.moved] == ids[:2] and first.not_pending == [ids[2]]
    assert again.moved == [] and again.not_pending == ids
    assert redis.xlen("{jobs}:dlq") == 2 and redis.xpending("jobs", "a")["pending"] == 0


def test_dead_letter_library_lists_filters_and_deletes(redis):
    ids = publish_many("jobs", [{"n": n} for n in range(4)])
    for group in ("a", "b"):
        redis.xgroup_create("jobs", group, id="0")
        redis.xreadgroup(group, "ghost", {"jobs": ">"})
    move(get_connection(), "jobs", "a", [(i, "E: a", "") for i in ids[:3]])
    move(get_connection(), "jobs", "b", [(ids[3], "E: b", "")])
    letters = dead_letters("jobs", count=10)
    assert [d.origin_id for d in letters] == ids and dead_letter_count("jobs") == 4
    assert [d.origin_id for d in dead_letters("jobs", group="b")] == [ids[3]]
    assert letters[0].deliveries == 1 and letters[0].error == "E: a" and letters[0].failed_at > 0
    assert json.loads(letters[0].original_fields["payload"]) == {"n": 0}
    assert delete_dead_letters("jobs", [letters[0].id, "1-1"]) == 1
    assert dead_letter_count("jobs") == 3


def test_replay_goes_to_the_failed_group_only(redis, make_loop):
    entry = publish("jobs", {"n": 1}, key="k1")
    loop_a, loop_b = make_loop("jobs:a", name="ca"), make_loop("jobs:b", name="cb")
    loop_a.tick()  # create group a and deliver to it; b sees the entry normally
    # Group a's handler failed for good; group b handled the entry.
    redis.delete("started:jobs:a", "handled:jobs:a")
    run_until([loop_b], lambda: redis.llen("handled:jobs:b") == 1 and settled(loop_b))
    run_until([loop_a], lambda: not loop_a.in_flight)
    redis.delete("handled:jobs:a")
    redis.xgroup_create("jobs", "c", id="0")  # a group to dead-letter from directly
    redis.xreadgroup("c", "ghost", {"jobs": ">"})
    [dead_id] = move(get_connection(), "jobs", "c", [(entry, "E: c", "")]).dead_letter_ids
    assert replay("jobs", "a", ids=[dead_id]).skipped == {dead_id: "other-group"}
    result = replay("jobs", "c", ids=[dead_id], dry_run=True)
    assert result.replayed == [(dead_id, None)] and redis.xlen("{jobs}:dlq") == 1
    result = replay("jobs", "c", ids=[dead_id])
    [(_, new_id)] = result.replayed
    assert redis.xlen("{jobs}:dlq") == 0
    fields = redis.xrange("jobs", new_id, new_id)[0][1]
    assert fields["shoal:target_group"] == "c" and fields["shoal:replay_of"] == entry and fields["key"] == "k1"
    assert "error" not in fields and "group" not in fields
    run_until([loop_a, loop_b], lambda: settled(loop_a) and settled(loop_b)
              and redis.xpending("jobs", "a")["pending"] == 0 and redis.xpending("jobs", "b")["pending"] == 0
              and redis.xinfo_groups("jobs")[0]["last-delivered-id"] == new_id
              and redis.xinfo_groups("jobs")[1]["last-delivered-id"] == new_id)
    assert redis.lrange("handled:jobs:b", 0, -1) == [entry]  # b acked the replay without running it
    assert redis.lrange("handled:jobs:a", 0, -1) == []  # so did a: the replay targets c
    # Group c (a consumer reading it) gets the replayed entry like any new one.
    [[_, got]] = redis.xreadgroup("c", "reader", {"jobs": ">"})
    assert [i for i, _ in got] == [new_id]


def test_replay_with_payload_override_is_handled_by_its_group(redis, make_loop):
    entry = publish("jobs", {"fail": "always"})
    redis.xgroup_create("jobs", "a", id="0")
    redis.xgroup_create("jobs", "b", id="$")
    redis.xreadgroup("a", "ghost", {"jobs": ">"})
    [dead_id] = move(get_connection(), "jobs", "a", [(entry, "RuntimeError: asked to fail", "")]).dead_letter_ids
    [(_, new_id)] = replay("jobs", "a", ids=[dead_id], payload_override={"fixed": True}).replayed
    loop_a, loop_b = make_loop("jobs:a", name="ca"), make_loop("jobs:b", name="cb")
    run_until([loop_a, loop_b], lambda: redis.llen("handled:jobs:a") == 1
              and redis.xinfo_groups("jobs")[1]["last-delivered-id"] == new_id and settled(loop_b))
    assert redis.lrange("handled:jobs:a", 0, -1) == [new_id]
    assert redis.llen("started:jobs:b") == 0 and redis.xpending("jobs", "b")["pending"] == 0
    assert redis.xrange("jobs", new_id, new_id)[0][1]["payload"] == '{"fixed":true}'


def test_replay_command_all_with_progress_and_errors(redis):
    ids = publish_many("jobs", [{"n": n} for n in range(450)])
    for group in ("a", "b"):
        redis.xgroup_create("jobs", group, id="0")
        redis.xreadgroup(group, "ghost", {"jobs": ">"})
    move(get_connection(), "jobs", "a", [(i, "E", "") for i in ids[:400]])
    move(get_connection(), "jobs", "b", [(i, "E", "") for i in ids[400:]])
    from io import StringIO

    out = StringIO()
    call_command("replay", "jobs", "--group", "a", "--all", stdout=out)
    assert "scanned 450/450" in out.getvalue() and "Replayed 400 dead letters" in out.getvalue()
    assert [d.group for d in dead_letters("jobs", count=1000)] == ["b"] * 50
    assert redis.xlen("jobs") == 850
    with pytest.raises(CommandError, match="--payload is not valid JSON"):
        call_command("replay", "jobs", "--group", "b", "--all", "--payload", "{nope")
    with pytest.raises(CommandError, match="none of the given ids"):
        call_command("replay", "jobs", "--group", "b", "--id", "1-1", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(ReplayError):
        replay("jobs", "b", ids=["1-1"], all=True)


def test_redis_guard_runs_a_key_once_and_lets_retries_run(redis, make_loop):
    first = publish("idem", {"n": 1}, key="order-1")
    dup = publish("idem", {"n": 1}, key="order-1")
    failing = publish("idem", {"n": 2}, key="order-2")
    loop = make_loop("idem:r", threads=1)
    original = loop.spec.handler
    attempts = []

    def fail_first_time(message):
        attempts.append(message.id)
        if message.id == failing and attempts.count(failing) == 1:
            raise RuntimeError("first time")
        original(message)

    object.__setattr__(loop.spec, "handler", fail_first_time)
    try:
        run_until(loop, lambda: redis.llen("handled:idem:r") == 2 and settled(loop)
                  and redis.xpending("idem", "r")["pending"] == 0)
    finally:
        object.__setattr__(loop.spec, "handler", original)
    assert redis.lrange("handled:idem:r", 0, -1) == [first, failing]
    assert dup not in attempts  # acked without running the handler
    assert attempts.count(failing) == 2  # the failure cleared the guard, so the retry ran
    assert redis.get("{idem}:idem:r:order-1") == "done" and redis.ttl("{idem}:idem:r:order-1") > 0


@pytest.mark.parametrize("options, error", [
    ({"idempotent": "yes"}, "idempotent must be"),
    ({"retention": "forever"}, "retention must be"),
    ({"retry_backoff": -1}, "retry_backoff must be"),
    ({"retry_backoff": (5, 1)}, "is below its base"),
    ({"retry_backoff": (1, 2, 3)}, "retry_backoff must be"),
    ({"max_deliveries": True}, "max_deliveries must be"),
])
def test_bad_failure_options_are_refused(options, error):
    with pytest.raises(ConsumerConfigError, match=error):
        consumer("x", group="y", **options)


def test_own_pending_entry_that_nothing_will_retry_is_taken_over_by_its_own_loop(redis, make_loop):
    entry = publish("failing", {"n": 1})
    loop = make_loop("failing:g", PENDING_TIMEOUT_MS=100, CLAIM_INTERVAL_MS=10)
    run_until(loop, lambda: loop.retries and settled(loop))
    loop.retries.clear()  # as if its retry were lost: the entry sits in this consumer's PEL
    redis.xclaim("failing", "g", "me", 0, [entry], idle=60_000, retrycount=1)
    # Until its failure is settled too: the count is read after the charge, not between the handler's
    # start and its failure's bookkeeping (read there on a cluster in CI: 1).
    run_until(loop, lambda: redis.llen("started:failing:g") == 2 and loop.retries and settled(loop))
    [row] = redis.xpending_range("failing", "g", "-", "+", 10)
    assert row["consumer"] == "me" and row["times_delivered"] == 2


def test_successful_handlers_pay_no_failure_round_trips(redis, make_loop):
    publish_many("jobs", [{"n": n} for n in range(300)])
    loop = make_loop(BATCH_SIZE=100, CLAIM_INTERVAL_MS=600_000)  # one claim pass, at the first tick
    loop.tick()  # creates the group and makes that claim pass
    redis.config_resetstat()
    run_until(loop, lambda: redis.llen("handled:jobs:a") == 300 and settled(loop))
    stats = redis.info("commandstats")
    used = {name.removeprefix("cmdstat_") for name in stats}
    assert used & {"eval", "expire", "set", "xautoclaim", "xpending", "xclaim"} == set(), used
    # What they do pay is the run ledger (runs.py): an HSET (runs_mark.lua) per read and an HDEL with the
    # acks, never a command per message (tests/streams_app/consuming/test_run_record.py: per read).
    calls = {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "hset", "hdel")}
    assert max(calls.values()) < 300, calls


def test_redis_guard_lets_the_same_entry_run_again_when_its_own_mark_is_left(redis, make_loop):
    # A chunk handed back, or a failed "done" write, leave a "running" mark naming this consumer
    # and this very entry. Its next delivery must run, not fail as "being handled" until it is
    # dead-lettered.
    entry = publish("idem", {"n": 1}, key="order-9")
    redis.set("{idem}:idem:r:order-9", f"running:me:{entry}", px=60_000)
    loop = make_loop("idem:r", threads=1)
    run_until(loop, lambda: redis.llen("handled:idem:r") == 1 and settled(loop))
    assert redis.lrange("handled:idem:r", 0, -1) == [entry]
    assert redis.get("{idem}:idem:r:order-9") == "done"
    assert not redis.exists("{idem}:dlq")


def test_redis_guard_refuses_the_same_entry_marked_by_a_consumer_not_known_dead(redis, make_loop):
    # Another consumer may still be running it (it claimed the entry from us, or we from it):
    # only a holder found dead (no liveness, no connection) makes the mark a leftover.
    entry = publish("idem", {"n": 1}, key="order-11")
    redis.set("{idem}:idem:r:order-11", f"running:other:{entry}", px=60_000)
    loop = make_loop("idem:r", threads=1)
    run_until(loop, lambda: loop.errors or loop.retries)
    assert redis.llen("started:idem:r") == 0, "ran while another consumer may be running it"
    loop.guard.confirmed_dead = frozenset({"other"})
    loop.retries = [(0.0, entry_id, deliveries) for _, entry_id, deliveries in loop.retries]
    run_until(loop, lambda: redis.llen("handled:idem:r") == 1 and settled(loop))


def test_redis_guard_still_refuses_a_different_entry_with_a_key_in_flight(redis, make_loop):
    entry = publish("idem", {"n": 1}, key="order-10")
    redis.set("{idem}:idem:r:order-10", "running:other-consumer:1-1", px=60_000)
    loop = make_loop("idem:r", threads=1)
    run_until(loop, lambda: loop.errors or loop.retries)
    assert redis.llen("started:idem:r") == 0, "a duplicate of a key in flight elsewhere ran"
    assert any(entry == entry_id for _, entry_id, _ in loop.retries)


def test_a_key_in_flight_elsewhere_does_not_use_up_max_deliveries(redis, make_loop):
    # max_deliveries=1: the delivery refused because another consumer runs the same key never ran
    # the handler. Before the fix it counted, and the entry was dead-lettered at once.
    entry = publish("idemonce", {"n": 1}, key="order-12")
    mark = "{idemonce}:idem:r:order-12"
    redis.set(mark, "running:other-consumer:1-1", px=60_000)
    loop = make_loop("idemonce:r", threads=1)
    run_until(loop, lambda: len(loop.retries) == 1)
    assert not redis.exists("{idemonce}:dlq") and loop.to_dead_letter == []
    [row] = redis.xpending_range("idemonce", "r", "-", "+", 10)
    # That delivery is not counted: the count stays the runs (none) + 1, the delivery it is on (runs.py).
    assert row["message_id"] == entry and row["times_delivered"] == 1
    redis.set(mark, "done")  # the other consumer finished the key
    run_until(loop, lambda: redis.xpending("idemonce", "r")["pending"] == 0 and settled(loop))
    assert not redis.exists("{idemonce}:dlq") and redis.llen("started:idemonce:r") == 0  # a duplicate, acked unrun


def test_a_foreign_entry_with_shoal_metadata_fields_is_dead_lettered_replayable(redis, make_loop):
    # A producer outside Shoal wrote fields under Shoal's dead-letter names. Before the fix the dead
    # letter held two shoal:group fields, the producer's read last, and replay skipped it ("other-group").
    entry = redis.xadd("jobs", {"payload": "not json", "color": "red", "shoal:group": "elsewhere",
                                "shoal:origin_id": "1-1", "shoal:error": "mine", "shoal:fields": "3:abc"})
    loop = make_loop("jobs:a", threads=1)
    run_until(loop, lambda: redis.xlen("{jobs}:dlq") == 1 and settled(loop))
    [letter] = dead_letters("jobs")
    assert (letter.group, letter.origin_id) == ("a", entry) and letter.error.startswith("decode")
    assert letter.original_fields == {"payload": "not json", "color": "red"}
    result = replay("jobs", "a", all=True)
    assert [old for old, _ in result.replayed] == [letter.id] and result.skipped == {}
    [(_, fields)] = redis.xrange("jobs", min="(" + entry)
    assert fields == {"payload": "not json", "color": "red", "shoal:target_group": "a", "shoal:replay_of": entry}


def test_a_failed_entry_waiting_for_its_retry_survives_an_xgroup_destroy(redis, make_loop):
    # Before the fix the recreated group no longer had it pending: the retry's XCLAIM found nothing,
    # and the entry was neither retried nor dead-lettered.
    FAILING_CALLS.clear()
    entry = publish("failing", {"n": 1})
    loop = make_loop("failing:g", PENDING_TIMEOUT_MS=400, CLAIM_INTERVAL_MS=50)
    run_until(loop, lambda: loop.retries)  # failed once, waiting for its retry
    # Due before the loop finds the group gone: its retry's XCLAIM is what gets NOGROUP.
    wait_for(lambda: loop.clock() >= loop.retries[0][0], timeout=10, what="the retry due")
    redis.xgroup_destroy("failing", "g")
    deadline = time.monotonic() + 30
    while not (redis.xlen("{failing}:dlq") == 1 and settled(loop)):
        assert time.monotonic() < deadline, (FAILING_CALLS, redis.xinfo_groups("failing"))
        loop.step()  # one pass that recreates a lost group, as run() does
    [(_, fields)] = redis.xrange("{failing}:dlq")
    assert fields["shoal:origin_id"] == entry and fields["shoal:deliveries"] == "4"
    assert [call[1] for call in FAILING_CALLS if call[0] == entry] == [1, 2, 3, 4]


def test_a_failed_entry_put_back_after_a_lost_group_is_not_claimable_before_its_back_off(redis, make_loop):
    # Found by a user trial: put back idle for a whole back-off, it was taken over at once by another
    # consumer and run there, and its holder's own retry ran it again.
    entry = publish("jobs", {"fail": "always"})
    loop = make_loop("jobs:a", RETRY_BACKOFF=60, RETRY_BACKOFF_MAX=60, PENDING_TIMEOUT_MS=400)
    run_until(loop, lambda: loop.retries)  # failed once: its retry is a minute away
    redis.xgroup_destroy("jobs", "a")

    def held_again():
        loop.step()
        try:
            return redis.xpending_range("jobs", "a", "-", "+", 10, consumername="me")
        except ResponseError:  # NOGROUP: not recreated yet
            return None

    [row] = wait_for(held_again, timeout=15, what="the failed entry pending again after the loss")
    assert row["message_id"] == entry
    assert row["time_since_delivered"] < 30_000, "put back as if its back-off were over: others would take it now"


def test_a_consumer_holding_only_a_retry_learns_of_the_loss_from_an_empty_read_while_the_group_settles(
        redis, make_loop):
    # Found by a user trial: busy at the loss (so no NOGROUP), its handlers done before its keep-alive
    # looked, then only empty reads: it never learned, and its failed entry was dropped when due.
    entry = publish("jobs", {"fail": "always"})
    loop = make_loop("jobs:a", name="holder", RETRY_BACKOFF=60, RETRY_BACKOFF_MAX=60)
    run_until(loop, lambda: loop.retries)
    later = publish("jobs", {"n": 2})
    other = make_loop("jobs:a", name="other")
    run_until(other, lambda: other.last_read_id == later)
    redis.xgroup_destroy("jobs", "a")
    # Recreated by the other at what it read, the stream's end: the holder's reads come back empty.
    wait_for(lambda: other.step() or redis.exists(other.settling), timeout=10, what="the group recreated by the other")

    def held_again():
        loop.step()
        return redis.xpending_range("jobs", "a", "-", "+", 10, consumername="holder")

    [row] = wait_for(held_again, timeout=15, what="the failed entry pending with its holder again")
    assert row["message_id"] == entry


def test_a_failed_entry_waiting_for_its_retry_survives_a_group_another_consumer_recreated_first(redis, make_loop):
    """The group is destroyed and the other consumer recreates it (after what it read) before this one's
    retry is due; this one reads nothing new, so it sees no NOGROUP. Before the fix its retry's XCLAIM
    found nothing in the new group and the entry was dropped: neither retried nor dead-lettered."""
    FAILING_CALLS.clear()
    entry = publish("failing", {"n": 1})
    loop = make_loop("failing:g", name="busy", PENDING_TIMEOUT_MS=30_000)
    run_until(loop, lambda: loop.retries)  # failed once, waiting for its retry
    later = publish("failing", {"n": 2})
    other = make_loop("failing:g", name="other", PENDING_TIMEOUT_MS=30_000)
    run_until(other, lambda: other.last_read_id == later)
    redis.xgroup_destroy("failing", "g")
    deadline = time.monotonic() + 30
    while not redis.exists(other.settling):  # recreated by the other, after what it read
        assert time.monotonic() < deadline
        other.step()
    while not (redis.xlen("{failing}:dlq") == 1 and settled(loop)):
        assert time.monotonic() < deadline, (FAILING_CALLS, redis.xinfo_groups("failing"))
        loop.step()
    [(_, fields)] = redis.xrange("{failing}:dlq")
    assert fields["shoal:origin_id"] == entry and fields["shoal:deliveries"] == "4"
    assert [call[1] for call in FAILING_CALLS if call[0] == entry] == [1, 2, 3, 4]


def test_replay_all_replays_what_was_dead_when_it_started_and_ends(redis):
    redis.xgroup_create("jobs", "a", id="$", mkstream=True)
    for n in range(250):  # two pages of REPLAY_BATCH
        redis.xadd("{jobs}:dlq", {"payload": json.dumps({"n": n}), "shoal:group": "a", "shoal:origin_stream": "jobs"})

    def fail_again(scanned, total):
        # A replayed entry that fails again is dead-lettered anew while the scan is under way.
        redis.xadd("{jobs}:dlq", {"payload": "{}", "shoal:group": "a", "shoal:origin_stream": "jobs"})

    result = replay("jobs", "a", all=True, progress=fail_again)
    assert len(result.replayed) == 250
    assert redis.xlen("{jobs}:dlq") == 2  # the new ones wait for the next replay


def test_move_decodes_its_own_replies_in_a_shared_pipeline_and_a_refused_move_blocks_nothing(redis_factory):
    """maxmemory refuses the XADD of a dead letter: that entry stays pending, untouched, and reports
    'refused'; the acked one reports 'not pending'; nothing is miscounted or half-moved."""
    import redis as redis_py

    from streams_app.deadletters.store import record_errors

    server = redis_factory()
    conn = redis_py.Redis(port=server.port)
    ids = [conn.xadd("jobs", {"payload": "{}"}).decode() for _ in range(3)]
    conn.xgroup_create("jobs", "a", id="0")
    conn.xreadgroup("a", "ghost", {"jobs": ">"})
    conn.xack("jobs", "a", ids[2])
    conn.config_set("maxmemory-policy", "noeviction")
    conn.config_set("maxmemory", "1")
    pipe = conn.pipeline(transaction=False)
    record_errors(conn, "jobs", "a", "me", [(ids[0], "E: x", "")], 60, pipeline=pipe)  # refused too
    queued = move(conn, "jobs", "a", [(i, "E: x", "") for i in ids], pipeline=pipe)
    result = queued.result(pipe.execute(raise_on_error=False))
    assert result.moved == [] and result.not_pending == [ids[2]]
    assert [i for i, _ in result.refused] == ids[:2] and "maxmemory" in result.refused[0][1]
    assert conn.xpending("jobs", "a")["pending"] == 2 and conn.xlen("{jobs}:dlq") == 0
    conn.config_set("maxmemory", "0")
    again = move(conn, "jobs", "a", [(i, "E: x", "") for i in ids])
    assert [i for i, _ in again.moved] == ids[:2] and conn.xpending("jobs", "a")["pending"] == 0


def test_original_fields_named_like_shoal_metadata_survive_dead_lettering_and_replay(redis):
    """A foreign producer's fields 'group', 'error', 'consumer', 'target_group' are its own: the dead
    letter keeps them (Shoal's metadata is shoal:*), and replay puts them back as they were."""
    import io

    from django.core.management import call_command

    from streams_app.deadletters.store import get_dead_letters

    theirs = {"payload": "{}", "group": "billing", "error": "none", "consumer": "ext", "target_group": "x"}
    ids = [redis.xadd("jobs", theirs) for _ in range(3)]
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "ghost", {"jobs": ">"})
    dead_ids = move(get_connection(), "jobs", "a", [(i, "E: x", "") for i in ids]).dead_letter_ids
    letters = get_dead_letters("jobs", dead_ids)
    assert all(d.original_fields == theirs and d.group == "a" and d.error == "E: x" for d in letters)
    call_command("replay", "jobs", "--group", "a", "--id", *dead_ids[:2], stdout=io.StringIO())  # several ids, one flag
    replayed = [f for _, f in redis.xrange("jobs") if "shoal:replay_of" in f]
    assert [f["shoal:replay_of"] for f in replayed] == ids[:2]
    assert all({k: v for k, v in f.items() if not k.startswith("shoal:")} == theirs for f in replayed)
    assert [i for i, _ in redis.xrange("{jobs}:dlq")] == dead_ids[2:]


def test_dead_letters_written_before_the_shoal_prefix_are_still_read_and_replayed(redis):
    """Upgrading: dead letters already in {S}:dlq carry the old bare metadata names."""
    from streams_app.deadletters.store import get_dead_letters

    redis.xgroup_create("jobs", "a", id="$", mkstream=True)
    old = {"payload": "{}", "key": "k1", "origin_stream": "jobs", "origin_id": "5-0", "group": "a",
           "consumer": "c", "deliveries": "5", "error": "E: old", "traceback": "", "failed_at": "1"}
    dead_ids = [redis.xadd("{jobs}:dlq", old) for _ in range(2)]
    [letter] = get_dead_letters("jobs", dead_ids[:1])
    assert (letter.group, letter.origin_id, letter.error, letter.deliveries) == ("a", "5-0", "E: old", 5)
    assert letter.original_fields == {"payload": "{}", "key": "k1"}
    assert len(replay("jobs", "a", ids=dead_ids[:1]).replayed) == 1
    assert len(replay("jobs", "a", all=True).replayed) == 1
    replayed = [f for _, f in redis.xrange("jobs")]
    assert replayed == [{"payload": "{}", "key": "k1", "shoal:target_group": "a", "shoal:replay_of": "5-0"}] * 2
    assert redis.xlen("{jobs}:dlq") == 0


def test_only_shoal_marks_an_entry_as_replayed_for_one_group():
    from streams_app.publishing.message import Message

    def target(fields):
        return Message("1-0", "jobs", "a", fields).target_group

    assert target({b"payload": b"{}", b"target_group": b"x"}) is None  # a producer's own field
    assert target({b"payload": b"{}", b"shoal:target_group": b"b"}) == "b"
    assert target({b"payload": b"{}", b"target_group": b"b", b"replay_of": b"1-0"}) == "b"  # replayed before the prefix
