"""capture_publishes: what code publishes is recorded, decoded as a consumer reads it, and nothing reaches Redis.

The test settings point Redis at 127.0.0.1:1, where nothing listens: a publish that tried Redis fails.
"""
import datetime
import decimal

import pytest
import redis
from django.db import transaction

from streams_app import publish, publish_many
from streams_app.exceptions import PublishError
from streams_app.testing import capture_publishes


def test_without_a_capture_a_publish_goes_to_redis_which_is_absent_here():
    with pytest.raises(redis.ConnectionError):
        publish("orders", {"id": 1})


def test_publishes_are_recorded_per_stream_in_order_with_keys_and_headers():
    at = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
    with capture_publishes() as published:
        first = publish("orders", {"id": 1, "at": at, "total": decimal.Decimal("9.99")}, key="order-1",
                        headers={"trace": "t1"})
        publish("emails", "hello")
        ids = publish_many("orders", [{"id": 2}, {"id": 3}], keys=["order-2", "order-3"])
    assert published.streams == ["orders", "emails"]
    assert published.payloads("orders") == [{"id": 1, "at": at, "total": decimal.Decimal("9.99")}, {"id": 2}, {"id": 3}]
    orders = published.on("orders")
    assert [m.id for m in orders] == [first, *ids]
    assert [m.key for m in orders] == ["order-1", "order-2", "order-3"]
    assert orders[0].headers == {"trace": "t1"}
    assert [m.payload for m in published] == [orders[0].payload, "hello", {"id": 2}, {"id": 3}]
    assert sorted(m.id for m in published) == [m.id for m in published]  # ids grow, as a stream's do


def test_bad_input_is_refused_as_in_production_and_nothing_is_recorded():
    with capture_publishes() as published:
        with pytest.raises(PublishError, match="not JSON-serialisable"):
            publish("orders", {"bad": object()})
        with pytest.raises(PublishError, match="message 1"):
            publish_many("orders", [{"ok": 1}, {"bad": float("nan")}])
    assert len(published) == 0


def test_diverted_says_whether_a_capture_is_active():
    from streams_app.publishing.producer import diverted

    assert not diverted()
    with capture_publishes():
        assert diverted()
    assert not diverted()


def test_the_capture_ends_with_its_block():
    with capture_publishes() as published:
        publish("orders", 1)
    with pytest.raises(redis.ConnectionError):
        publish("orders", 2)
    assert published.payloads("orders") == [1]


def test_captures_nest_and_each_records_what_was_published_while_it_was_active():
    with capture_publishes() as outer:
        publish("a", 1)
        with capture_publishes() as inner:
            publish("a", 2)
        publish("a", 3)
    assert outer.payloads("a") == [1, 2, 3]
    assert inner.payloads("a") == [2]


def test_the_pytest_fixture_captures(shoal_published):
    publish("orders", {"id": 1})
    assert shoal_published.payloads("orders") == [{"id": 1}]


@pytest.mark.django_db(transaction=True)
def test_an_outbox_publish_is_recorded_when_its_transaction_commits_and_not_when_it_rolls_back():
    from streams_app.outbox.models import OutboxMessage

    with capture_publishes() as published:
        with transaction.atomic():
            key = publish("orders", {"id": 1}, outbox=True)
            assert len(published) == 0  # not committed yet: the relay could not have sent it
        assert published.payloads("orders") == [{"id": 1}]
        with pytest.raises(RuntimeError):
            with transaction.atomic():
                publish_many("orders", [{"id": 2}], outbox=True)
                raise RuntimeError("the request fails after publishing")
    assert published.payloads("orders") == [{"id": 1}]
    message = published.on("orders")[0]
    assert message.key == key and message.idempotency_id.startswith("outbox-")
    assert not OutboxMessage.objects.exists()  # captured instead of written: no relay runs in a test


@pytest.mark.django_db
def test_in_a_test_transaction_outbox_publishes_show_with_the_on_commit_callbacks(django_capture_on_commit_callbacks):
    with capture_publishes() as published:
        with django_capture_on_commit_callbacks(execute=True):
            publish("orders", {"id": 1}, outbox=True)
            assert len(published) == 0
    assert published.payloads("orders") == [{"id": 1}]
