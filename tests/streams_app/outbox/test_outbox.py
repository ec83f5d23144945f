"""The outbox in one process: what publish(..., outbox=True) writes, and one relay's passes (issue 17).

Real Redis, the test database of pytest-django (SQLite in memory). ``transactional_db``: the
outbox depends on real commits and on_commit callbacks, which the ``db`` fixture's wrapping
transaction would never run. The multi-process behaviour (kills, outages, PostgreSQL) is in
test_outbox_processes.py.
"""
import json
import signal
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from streams_app import publish, publish_many
from streams_app.exceptions import PublishError
from streams_app.outbox import cleanup, enqueue
from streams_app.outbox.models import OutboxMessage
from streams_app.outbox.relay import Relay
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = {"OUTBOX_BATCH": 500, "OUTBOX_SWEEP_INTERVAL": 0.1, "OUTBOX_RETENTION": 3600}


@pytest.fixture
def relay():
    """relay() -> this test's Relay (quick settings), relay(fresh=True) -> another; released at teardown
    (on SQLite, one holds the relay lock and the others stand by)."""
    made = []

    def make(fresh=False):
        if fresh or not made:
            made.append(Relay("default", config=QUICK))
        return made[-1]

    yield make
    for one in made:
        one.guard.release()


def payloads(redis, stream):
    return [(fields.get("key"), json.loads(fields["payload"])) for _, fields in redis.xrange(stream)]


def test_inside_a_transaction_the_row_is_written_and_nothing_reaches_redis_until_the_relay(redis, relay):
    with transaction.atomic():
        key = publish("orders", {"id": 1}, key="order-1", outbox=True)
        assert key == "order-1"
        assert OutboxMessage.objects.filter(relayed_at__isnull=True).count() == 1
        assert not redis.exists("orders")
    assert redis.lrange(enqueue.NUDGE_KEY, 0, -1) == ["1"]  # the commit nudged the relay
    assert relay().tick() is False
    assert payloads(redis, "orders") == [("order-1", {"id": 1})]
    row = OutboxMessage.objects.get()
    assert row.relayed_at is not None and row.entry_id == redis.xrange("orders")[0][0]


def test_with_redis_frozen_a_commit_waits_for_its_nudge_a_moment_not_the_pools_timeouts(redis_factory, use_redis):
    # A user trial: with Redis SIGSTOPped, a commit took 5 s once every sweep interval.
    server = redis_factory()
    use_redis(server)
    publish("orders", {"n": 0}, outbox=True)  # connections made while Redis answers
    server.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with transaction.atomic():
            publish("orders", {"n": 1}, outbox=True)
        took = time.monotonic() - started
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert took < 4, took  # NUDGE_TIMEOUT is 0.5 s; the shared pool's waits were 5 s and more
    assert OutboxMessage.objects.filter(relayed_at__isnull=True).count() == 2


def test_a_rolled_back_transaction_leaves_no_row_and_no_nudge(redis, relay):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            publish("orders", {"id": 1}, outbox=True)
            raise RuntimeError("the view failed")
    assert not OutboxMessage.objects.exists()
    assert not redis.exists(enqueue.NUDGE_KEY)
    relay().tick()
    assert not redis.exists("orders")


def test_outside_a_transaction_the_row_is_its_own_transaction_and_a_key_is_generated(redis, relay):
    key = publish("orders", {"id": 2}, outbox=True)
    assert key.startswith("outbox-") and len(key) > 20
    assert OutboxMessage.objects.get().key == key
    relay().tick()
    assert payloads(redis, "orders") == [(key, {"id": 2})]


def test_with_redis_away_commits_try_to_nudge_once_per_sweep_interval(redis_factory, use_redis, monkeypatch, settings):
    """Writers are not slowed by Redis's absence: each nudge would pay connection retries (a host that
    does not answer: SOCKET_CONNECT_TIMEOUT) at every commit. The rows wait for the relay's sweep."""
    server = redis_factory()
    use_redis(server)
    server.stop()
    settings.STREAMS = {**settings.STREAMS, "OUTBOX_SWEEP_INTERVAL": 3600}
    attempts = []
    real = enqueue.get_connection
    monkeypatch.setattr(enqueue, "get_connection", lambda: attempts.append(1) or real())
    for n in range(5):
        with transaction.atomic():
            publish("orders", {"n": n}, outbox=True)
    assert len(attempts) == 1
    assert OutboxMessage.objects.filter(relayed_at__isnull=True).count() == 5
    monkeypatch.setattr(enqueue, "_quiet_until", 0.0)  # the interval has passed
    server.start()
    publish("orders", {"n": 5}, outbox=True)
    assert len(attempts) == 2 and server.client().llen(enqueue.NUDGE_KEY) == 1


def test_publish_many_writes_every_row_or_none(redis, relay):
    with transaction.atomic():
        keys = publish_many("orders", [{"n": i} for i in range(3)], keys=["a", "b", None], outbox=True)
    assert keys[:2] == ["a", "b"] and keys[2].startswith("outbox-")
    with pytest.raises(PublishError, match=r"message 1: .*not JSON-serialisable"):
        publish_many("orders", [{"n": 1}, {"n": object()}], outbox=True)
    assert OutboxMessage.objects.count() == 3
    relay().tick()
    assert [p for _, p in payloads(redis, "orders")] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_bad_input_fails_in_the_callers_transaction(redis, relay):
    with pytest.raises(PublishError, match="at most 255 characters"):
        publish("orders", {}, key="k" * 256, outbox=True)
    with pytest.raises(PublishError, match="not to a Redis pipeline"):
        publish("orders", {}, outbox=True, pipeline=redis.pipeline())
    with pytest.raises(PublishError, match="must not contain"):
        publish("or{ders}", {}, outbox=True)
    # What a database refuses (PostgreSQL: NUL in text; column sizes) is refused before any SQL, so the
    # caller's transaction goes on (on PostgreSQL too: test_outbox_processes.py).
    with pytest.raises(PublishError, match=r"key must not contain a NUL character \(\\x00, at position 1\)"):
        publish("orders", {}, key="a\x00b", outbox=True)
    with pytest.raises(PublishError, match=r"message 2: an outbox message key must not contain a NUL"):
        publish_many("orders", [{}, {}, {}], keys=["a", "b", "\x00"], outbox=True)
    with pytest.raises(PublishError, match="stream name must not contain a NUL"):
        publish("ord\x00ers", {}, outbox=True)
    with pytest.raises(PublishError, match="stream name is at most 200 characters, not 201"):
        publish("s" * 201, {}, outbox=True)
    with pytest.raises(PublishError, match="maxlen is at most 9223372036854775807"):
        publish("orders", {}, maxlen=2**63, outbox=True)
    assert not OutboxMessage.objects.exists()
    publish("orders", {"note": "a\x00b"}, key="fine", outbox=True)  # in the payload it is JSON's \u0000
    relay().tick()
    assert payloads(redis, "orders") == [("fine", {"note": "a\x00b"})]


def test_messages_sharing_a_key_have_one_effect_each_and_a_resent_copy_none(redis, relay):
    """The docs' own key=f"order-{pk}" names several events of one order: each has its own effect."""
    from streams_app.consuming.idempotency import DbGuard, RedisGuard
    from streams_app.publishing.message import Message

    with transaction.atomic():
        publish("orders", {"event": "created"}, key="order-1", outbox=True)
        publish("orders", {"event": "paid"}, key="order-1", outbox=True)
    relay().tick()
    OutboxMessage.objects.update(relayed_at=None)  # as if the relay died before marking them: sent again
    relay().tick()
    entries = [Message(entry_id, "orders", "g", fields, consumer="c1") for entry_id, fields in redis.xrange("orders")]
    assert [m.payload["event"] for m in entries] == ["created", "paid", "created", "paid"]
    assert all(m.key == "order-1" for m in entries)
    assert entries[0].idempotency_id == entries[2].idempotency_id != entries[1].idempotency_id

    effects = []
    guard = DbGuard()
    assert [guard.call(lambda m: effects.append(m.payload["event"]), m) for m in entries] == [True, True, False, False]
    assert effects == ["created", "paid"]

    guard = RedisGuard(redis, "orders", "g", running_ms=10_000, ttl=60)
    to_run, duplicates, busy = guard.begin(entries[:2])
    assert (to_run, duplicates, busy) == (entries[:2], [], [])
    guard.end(entries[:2], [])
    assert guard.begin(entries[2:]) == ([], entries[2:], [])


def test_the_relay_says_what_it_relayed_and_nothing_when_idle(redis, relay, caplog):
    caplog.set_level("INFO", logger="streams_app.outbox")
    lines = lambda: [r.getMessage() for r in caplog.records if "relayed" in r.getMessage()]  # noqa: E731
    one = relay()
    publish("orders", {"n": 0}, outbox=True)
    one.tick()
    assert lines() == ["Relay: relayed 1 row to Redis; 0 rows waiting"]
    for _ in range(5):
        one.tick()
    assert len(lines()) == 1  # idle passes say nothing
    publish_many("orders", [{"n": 1}, {"n": 2}], outbox=True)
    # At most one line per sweep interval however often commits nudge it; the next pass after it says the rest.
    wait_for(lambda: one.tick() is False and len(lines()) == 2, timeout=30, what="the second progress line")
    assert lines()[1] == "Relay: relayed 2 rows to Redis; 0 rows waiting"


def test_only_a_pass_that_sent_rows_says_redis_is_reachable_again(redis, relay, caplog):
    # A pass with nothing to claim never talked to Redis: during an outage it must not announce the end.
    caplog.set_level("INFO", logger="streams_app.outbox")
    again = lambda: [r for r in caplog.records if "reachable again" in r.getMessage()]  # noqa: E731
    one = relay()
    one.down_since = time.monotonic() - 5  # as after a failed pass
    one.tick()
    assert again() == [] and one.down_since is not None
    publish("orders", {"n": 0}, outbox=True)
    one.tick()
    assert len(again()) == 1 and one.down_since is None


def test_a_refused_row_is_retried_later_holds_back_its_key_and_says_why(redis, relay):
    redis.set("orders", "someone's string")
    publish("orders", {"n": 0}, key="k", outbox=True)
    publish("orders", {"n": 1}, key="k", outbox=True)
    publish("other", {"n": 0}, key="k", outbox=True)  # same key, another stream: not held back
    relay().tick()
    failing = OutboxMessage.objects.filter(attempts__gt=0)
    # The whole batch went in one pipeline: both rows of the wrong-type key failed on their own.
    assert [r.fields["payload"] for r in failing] == ['{"n":0}', '{"n":1}']
    assert "holds another type, not a stream" in failing[0].last_error
    assert failing[0].next_attempt_at > timezone.now()
    assert redis.xlen("other") == 1
    figures = cleanup.backlog()
    assert (figures["rows"], figures["failing"]) == (2, 2)

    # Due again, but the second row's turn only comes after the first's: sent in order once the key is fixed.
    redis.delete("orders")
    OutboxMessage.objects.filter(id=failing[1].id).update(next_attempt_at=None)
    relay().tick()
    assert not redis.exists("orders")  # n=1 waits for n=0, which is not due yet
    OutboxMessage.objects.update(next_attempt_at=None)
    relay().tick()
    assert [p for _, p in payloads(redis, "orders")] == [{"n": 0}, {"n": 1}]
    assert cleanup.backlog()["rows"] == 0


def test_relayed_rows_are_deleted_after_the_retention_in_bounded_batches(redis, relay):
    publish_many("orders", [{"n": i} for i in range(25)], outbox=True)
    relay().tick()
    OutboxMessage.objects.update(relayed_at=timezone.now() - timedelta(hours=2))
    publish("orders", {"n": "fresh"}, outbox=True)
    relay().tick()
    assert cleanup.delete_relayed("default", retention=3600, batch=2) == 2 * cleanup.MAX_BATCHES
    assert cleanup.delete_relayed("default", retention=3600, batch=100) == 5
    assert OutboxMessage.objects.count() == 1  # the fresh one, relayed less than an hour ago


def test_a_second_relay_on_the_same_sqlite_database_stands_by_and_says_so(redis, relay, caplog):
    first, second = relay(), relay(fresh=True)
    assert first.tick() is False
    with caplog.at_level("WARNING", logger="streams_app.outbox"):
        publish("orders", {"n": 1}, outbox=True)
        second.tick()
        assert not redis.exists("orders")
        assert "one relay runs at a time" in caplog.text
        first.guard.release()  # the first one stops
        second.tick()
        assert "took over" in caplog.text
    assert redis.xlen("orders") == 1
    second.guard.release()


def test_the_relay_publishes_the_backlog_gauges(redis, relay):
    from prometheus_client import REGISTRY

    publish("orders", {"n": 1}, outbox=True)
    OutboxMessage.objects.update(created_at=timezone.now() - timedelta(seconds=90))
    redis.set("orders", "x")
    relay().tick()
    assert REGISTRY.get_sample_value("shoal_outbox_rows", {"database": "default"}) == 1
    assert REGISTRY.get_sample_value("shoal_outbox_failing_rows", {"database": "default"}) == 1
    assert REGISTRY.get_sample_value("shoal_outbox_oldest_seconds", {"database": "default"}) >= 90


def test_the_relay_routes_a_partitioned_streams_rows_as_a_direct_publish_does(settings):
    from streams_app.partitioning import partitions
    from streams_app.outbox.relay import target_stream

    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 6}}
    for key in ("order-1", "order-2", "order-42"):
        assert target_stream("orders", key) == partitions.route("orders", key)
    assert target_stream("jobs", "order-1") == "jobs"


def test_the_relay_refuses_rows_of_a_stream_recorded_as_partitioned_but_no_longer_declared(redis, relay, settings):
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 6}}
    publish("orders", {"n": 0}, key="k")
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {}}
    publish("orders", {"n": 1}, key="k", outbox=True)
    publish("other", {"n": 0}, key="k", outbox=True)
    relay().tick()
    assert not redis.exists("orders") and redis.xlen("other") == 1
    [row] = OutboxMessage.objects.filter(attempts__gt=0)
    assert row.stream == "orders" and "PartitionConfigError" in row.last_error
    assert "no longer declares it" in row.last_error and row.relayed_at is None
