"""publish(..., outbox=True, run_after=...): the row commits with the caller's transaction, the relay
schedules it, the consumers' mover delivers it when due (streams_app/publishing/scheduled.py, outbox/relay.py)."""
import json
import math
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from streams_app import publish, publish_many
from streams_app.partitioning import partitions
from streams_app.publishing import scheduled
from streams_app.redis.connection import get_connection
from streams_app.redis.keys import scheduled_key
from streams_app.outbox.models import OutboxMessage
from streams_app.outbox.relay import Relay

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.both_redis]

QUICK = {"OUTBOX_BATCH": 500, "OUTBOX_SWEEP_INTERVAL": 0.1, "OUTBOX_RETENTION": 3600}


@pytest.fixture
def relay():
    made = Relay("default", config=QUICK)
    yield made
    made.guard.release()


def test_a_deferred_outbox_message_commits_with_the_row_and_the_relay_schedules_it(redis, relay):
    before = time.time() * 1000
    with transaction.atomic():
        key = publish("orders", {"id": 1}, key="order-1", outbox=True, run_after=timedelta(seconds=30))
    assert key == "order-1"  # an outbox publish returns the key, deferred or not
    row = OutboxMessage.objects.get()
    due = int(row.fields["shoal:run_after"])
    # Fixed at the publish call, by its clock, rounded up to the ms (so compared with the next ms up: it
    # failed when the check came within the same millisecond).
    assert before + 30_000 <= due <= math.ceil(time.time() * 1000) + 30_000
    assert not redis.exists("orders", scheduled_key("orders"))
    relay.tick()
    row.refresh_from_db()
    assert row.relayed_at is not None and row.entry_id == row.fields["shoal:scheduled_id"]
    assert redis.zrange(scheduled_key("orders"), 0, -1, withscores=True) == [(row.entry_id, due)]
    assert not redis.exists("orders")
    OutboxMessage.objects.update(relayed_at=None)  # as if the relay died before marking it: sent again
    relay.tick()
    assert redis.zcard(scheduled_key("orders")) == 1  # the same scheduled id: scheduled once


def test_a_rolled_back_deferred_publish_schedules_nothing(redis, relay):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            publish("orders", {"id": 1}, outbox=True, run_after=timedelta(0))
            raise RuntimeError("the view failed")
    relay.tick()
    assert not OutboxMessage.objects.exists() and not redis.exists(scheduled_key("orders"))


def test_deferred_and_direct_rows_of_one_batch_each_go_where_they_belong(redis, relay):
    with transaction.atomic():
        publish("orders", {"n": 0}, key="a", outbox=True)
        publish_many("orders", [{"n": 1}, {"n": 2}], keys=["b", "c"], outbox=True,
                     run_after=datetime(2000, 1, 1, tzinfo=UTC))  # long past: due at once
        publish("orders", {"n": 3}, key="d", outbox=True)
    relay.tick()
    rows = {row.key: row for row in OutboxMessage.objects.all()}
    direct = [entry_id for entry_id, _ in redis.xrange("orders")]
    assert direct == [rows["a"].entry_id, rows["d"].entry_id]
    assert sorted(redis.zrange(scheduled_key("orders"), 0, -1)) == sorted([rows["b"].entry_id, rows["c"].entry_id])
    assert scheduled.move_due(get_connection(), "orders").moved == 2
    moved = [fields for _, fields in redis.xrange("orders")][2:]
    assert [json.loads(f["payload"]) for f in moved] == [{"n": 1}, {"n": 2}]
    # The row's own id goes with the message, so the consumers' guards make one effect of a re-send.
    assert [f["shoal:idempotency_id"] for f in moved] == [rows["b"].fields["shoal:idempotency_id"],
                                                         rows["c"].fields["shoal:idempotency_id"]]
    assert [f["shoal:run_after"] for f in moved] == [str(946684800000)] * 2


def test_a_deferred_row_goes_to_the_partition_of_its_key(redis, relay, settings):
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 3}}
    publish("orders", {"n": 1}, key="customer-9", outbox=True, run_after=timedelta(0))
    relay.tick()
    target = partitions.route("orders", "customer-9")
    assert redis.zcard(scheduled_key(target)) == 1
    assert sum(redis.zcard(scheduled_key(name)) for name in partitions.names("orders")) == 1


def test_a_row_whose_scheduled_set_is_of_another_type_waits_with_its_error_and_others_go_on(redis, relay):
    redis.set(scheduled_key("orders"), "precious")
    publish("orders", {"n": 1}, key="a", outbox=True, run_after=timedelta(0))
    publish("orders", {"n": 2}, key="b", outbox=True)
    relay.tick()
    refused, sent = OutboxMessage.objects.order_by("id")
    assert refused.relayed_at is None and refused.attempts == 1 and refused.next_attempt_at is not None
    assert "Redis key '{orders}:scheduled' holds a string" in refused.last_error
    assert sent.relayed_at is not None
    assert [json.loads(f["payload"]) for _, f in redis.xrange("orders")] == [{"n": 2}]
    assert redis.get(scheduled_key("orders")) == "precious"
    redis.delete(scheduled_key("orders"))
    OutboxMessage.objects.filter(id=refused.id).update(next_attempt_at=None)  # the admin's "retry now"
    relay.tick()
    refused.refresh_from_db()
    assert refused.relayed_at is not None and redis.zcard(scheduled_key("orders")) == 1
