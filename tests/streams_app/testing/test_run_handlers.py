"""run_handlers and drain: the registered handlers run in process, with runconsumer's decisions, no Redis.

The test settings point Redis at 127.0.0.1:1, where nothing listens: anything that tried Redis fails.
"""
import datetime

import pytest

from streams_app import consumer, publish
from streams_app.exceptions import ConsumerConfigError
from streams_app.testing import Status, capture_publishes, drain, make_message, run_handlers
from tests.testapp.models import Effect

pytestmark = pytest.mark.usefixtures("clean_registry")


def test_a_handler_gets_the_message_decoded_as_runconsumer_decodes_it():
    seen = []
    at = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)

    @consumer("t.orders", group="ship")
    def ship(message):
        seen.append((message.stream, message.group, message.payload, message.key, message.headers, message.deliveries))

    report = run_handlers(make_message({"id": 1, "at": at}, stream="t.orders", key="k", headers={"h": 1}))
    assert seen == [("t.orders", "ship", {"id": 1, "at": at}, "k", {"h": 1}, 1)]
    assert [d.status for d in report] == [Status.HANDLED]
    assert report.assert_handled() is report


def test_every_group_of_the_stream_runs_or_the_one_named():
    ran = []
    consumer("t.jobs", group="a")(lambda m: ran.append("a"))
    consumer("t.jobs", group="b")(lambda m: ran.append("b"))
    assert [d.group for d in run_handlers(make_message(1, stream="t.jobs"))] == ["a", "b"]
    assert [d.group for d in run_handlers(make_message(1), stream="t.jobs", group="b")] == ["b"]
    assert ran == ["a", "b", "b"]
    with pytest.raises(ConsumerConfigError, match="no consumer is registered for t.jobs:c"):
        run_handlers(make_message(1), stream="t.jobs", group="c")


def test_a_failing_handler_is_retried_up_to_max_deliveries_without_sleeping_then_would_be_dead_lettered():
    deliveries = []

    @consumer("t.flaky", group="g", max_deliveries=3, retry_backoff=(60, 600))
    def flaky(message):
        deliveries.append(message.deliveries)
        raise ValueError(f"down on delivery {message.deliveries}")

    [delivery] = run_handlers(make_message({}, stream="t.flaky"))
    assert deliveries == [1, 2, 3]
    assert delivery.status is Status.DEAD_LETTERED and delivery.dead_lettered
    assert [str(e) for e in delivery.errors] == ["down on delivery 1", "down on delivery 2", "down on delivery 3"]
    assert delivery.retry_delays == [60, 120]  # what runconsumer would have waited, not slept here
    with pytest.raises(AssertionError, match="dead-lettered after 3 deliveries .ValueError: down on delivery 3"):
        run_handlers(make_message({}, stream="t.flaky")).assert_handled()


def test_retry_false_delivers_once_and_reports_the_failure_runconsumer_would_retry():
    @consumer("t.once", group="g", max_deliveries=3)
    def fails(message):
        raise KeyError("x")

    [delivery] = run_handlers(make_message({}, stream="t.once"), retry=False)
    assert delivery.status is Status.FAILED and isinstance(delivery.error, KeyError)
    [last] = run_handlers(make_message({}, stream="t.once", deliveries=3), retry=False)
    assert last.status is Status.DEAD_LETTERED


def test_a_handler_that_recovers_on_a_retry_is_handled():
    @consumer("t.recovers", group="g")
    def recovers(message):
        if message.deliveries < 2:
            raise ConnectionError("the payment service blinked")

    [delivery] = run_handlers(make_message({}, stream="t.recovers"))
    assert delivery.status is Status.HANDLED and delivery.deliveries == 2 and len(delivery.errors) == 1


def test_poison_input_would_be_dead_lettered_at_once_and_the_handler_never_runs():
    ran = []
    consumer("t.poison", group="g")(ran.append)
    [delivery] = run_handlers(make_message(fields={"payload": "{not json"}, stream="t.poison"))
    assert delivery.status is Status.DEAD_LETTERED and delivery.deliveries == 1 and ran == []
    assert "not valid JSON" in str(delivery.error)


def test_a_generator_result_fails_as_it_does_under_runconsumer():
    consumer("t.shape", group="g", max_deliveries=1)(lambda m: (yield_ for yield_ in ()))
    [delivery] = run_handlers(make_message(1, stream="t.shape"))
    assert delivery.dead_lettered and "must not yield" in str(delivery.error)


def test_async_handlers_run_on_an_event_loop():
    @consumer("t.async", group="g")
    async def handle(message):
        import asyncio

        await asyncio.sleep(0)
        publish("t.async.done", message.payload)

    report = run_handlers(make_message({"n": 1}, stream="t.async"))
    assert report[0].handled and [m.payload for m in report.published] == [{"n": 1}]


@pytest.mark.django_db
def test_idempotent_db_runs_in_the_tests_transaction_and_a_duplicate_is_acked_unseen():
    @consumer("t.db", group="g", idempotent="db")
    def write(message):
        Effect.objects.create(name=message.payload["name"], entry_id=message.id)

    message = make_message({"name": "one"}, stream="t.db", key="order-1")
    assert run_handlers(message)[0].status is Status.HANDLED
    assert run_handlers(make_message({"name": "two"}, stream="t.db", key="order-1"))[0].status is Status.DUPLICATE
    assert list(Effect.objects.values_list("name", flat=True)) == ["one"]


@pytest.mark.django_db
def test_idempotent_db_rolls_back_a_failed_delivery_so_the_retry_writes_once():
    @consumer("t.db2", group="g", idempotent="db")
    def write(message):
        Effect.objects.create(name="x", entry_id=message.id)
        if message.deliveries == 1:
            raise RuntimeError("after the write")

    [delivery] = run_handlers(make_message({}, stream="t.db2"))
    assert delivery.handled and delivery.deliveries == 2 and Effect.objects.count() == 1


def test_idempotent_redis_keeps_its_marks_in_memory_for_the_capture():
    ran = []
    consumer("t.redis", group="g", idempotent="redis")(lambda m: ran.append(m.payload))
    with capture_publishes():
        run_handlers(make_message(1, stream="t.redis", key="k"))
        assert run_handlers(make_message(2, stream="t.redis", key="k"))[0].status is Status.DUPLICATE
    with capture_publishes():
        run_handlers(make_message(3, stream="t.redis", key="k"))
    assert ran == [1, 3]


def test_drain_runs_a_flow_of_two_handlers_and_records_every_publish():
    @consumer("t.placed", group="billing")
    def bill(message):
        publish("t.billed", {"order": message.payload["order"], "amount": 10}, key=message.key)

    shipped = []

    @consumer("t.billed", group="shipping")
    def ship(message):
        shipped.append(message.payload)

    with capture_publishes() as published:
        publish("t.placed", {"order": 7}, key="order-7")
        publish("t.elsewhere", "nobody here consumes this")
        report = drain(published)
    assert [(d.message.stream, d.group, d.status) for d in report] == [
        ("t.placed", "billing", Status.HANDLED), ("t.billed", "shipping", Status.HANDLED)]
    assert shipped == [{"order": 7, "amount": 10}]
    assert published.streams == ["t.placed", "t.elsewhere", "t.billed"]
    assert published.on("t.billed")[0].key == "order-7"
    assert drain(published) == []  # everything was delivered once


def test_drain_after_the_capture_ended_still_collects_the_chained_publishes():
    consumer("t.first", group="g")(lambda m: publish("t.second", m.payload + 1))
    consumer("t.second", group="g")(lambda m: None)
    with capture_publishes() as published:
        publish("t.first", 1)
    drain(published)
    assert published.payloads("t.second") == [2]


def test_drain_stops_a_flow_that_publishes_forever():
    consumer("t.loop", group="g")(lambda m: publish("t.loop", m.payload))
    with capture_publishes() as published:
        publish("t.loop", 1)
        with pytest.raises(RuntimeError, match="keep publishing"):
            drain(published, limit=5)


def test_an_outer_drain_does_not_deliver_again_what_an_inner_drain_delivered():
    seen = []
    consumer("t.nest", group="g")(lambda m: (seen.append(m.payload), publish("t.nested", m.payload)))
    consumer("t.nested", group="g")(lambda m: seen.append(("chained", m.payload)))
    with capture_publishes() as outer:
        publish("t.nest", 1)
        with capture_publishes() as inner:
            publish("t.nest", 2)
            drain(inner)
        assert seen == [2, ("chained", 2)]
        report = drain(outer)
    assert seen == [2, ("chained", 2), 1, ("chained", 1)]
    assert [d.message.payload for d in report] == [1, 1]
    assert outer.payloads("t.nest") == [1, 2]  # recorded all the same


def test_idempotent_redis_outside_a_capture_keeps_its_marks_for_the_whole_call():
    runs = []
    consumer("t.idem", group="g", idempotent="redis")(lambda m: runs.append(m.id))
    first, again = make_message(1, stream="t.idem", key="k"), make_message(1, stream="t.idem", key="k")
    assert [d.status for d in run_handlers([first, again])] == [Status.HANDLED, Status.DUPLICATE]
    # A later call outside a capture starts over (docs/testing.md): marks last one call, or the outermost capture.
    assert [d.status for d in run_handlers(again)] == [Status.HANDLED]
    assert len(runs) == 2


def test_idempotent_redis_marks_last_one_drain_of_a_capture_that_ended():
    runs = []
    consumer("t.idem2", group="g", idempotent="redis")(lambda m: runs.append(m.payload))
    with capture_publishes() as published:
        publish("t.idem2", 1, key="k")
        publish("t.idem2", 2, key="k")
    assert [d.status for d in drain(published)] == [Status.HANDLED, Status.DUPLICATE]
    assert runs == [1]
