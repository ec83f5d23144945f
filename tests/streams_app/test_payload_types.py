"""Datetimes, Decimals, UUIDs... published as they are, through a real ``runconsumer`` process, the
dead letters and both replays (CLI and the admin's edited replay), arriving as the same types."""
import datetime
import decimal
import json
import uuid
import zoneinfo

import pytest
from django.core.management import call_command

from streams_app import publish
from streams_app.redis import keys
from streams_app.admin import mirror
from streams_app.models import DeadLetter
from tests.streams_app.admin.fixtures import staff_client  # noqa: F401
from tests.testapp.consumers import _described
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

PARIS = zoneinfo.ZoneInfo("Europe/Paris")


def typed_payload():
    return {
        "at": datetime.datetime(2026, 11, 30, 20, 29, 11, 364826, tzinfo=datetime.UTC),
        "local": datetime.datetime(2026, 7, 1, 9, 30, tzinfo=PARIS),  # +02:00 in summer
        "naive": datetime.datetime(2026, 1, 2, 3, 4, 5),
        "day": datetime.date(2026, 2, 28),
        "opens": datetime.time(8, 15, 0, 250),
        "opens_tz": datetime.time(8, 15, tzinfo=datetime.timezone(datetime.timedelta(hours=-5))),
        "took": datetime.timedelta(days=1, hours=2, microseconds=7),
        "total": decimal.Decimal("9.99"),
        "precise": decimal.Decimal("0.10000000000000000000000001"),
        "id": uuid.UUID("0b6c2a1e-3f4d-4c8e-9a7b-1d2e3f405162"),
        "items": [{"sku": "A-1", "price": decimal.Decimal("1.50")}, {"sku": "B/2~x", "at": datetime.date(2026, 1, 1)}],
        "plain": {"n": 1, "s": "2026-01-01", "f": 1.5, "none": None},
    }


def expected():
    # What the handler must see: the same values and types. A zone becomes its UTC offset (ISO 8601
    # carries offsets, not zone names): equal instant, equal offset.
    return _described({**typed_payload(), "local": datetime.datetime(
        2026, 7, 1, 9, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))})


def seen(redis, count):
    wait_for(lambda: redis.llen("typed:seen") >= count, timeout=60, what=f"{count} handler calls")
    return json.loads(redis.lindex("typed:seen", count - 1))


def dead(redis, count):
    wait_for(lambda: redis.xlen(keys.dead_letter_key("typed")) >= count, timeout=60, what=f"{count} dead letters")
    return [i for i, _ in redis.xrange(keys.dead_letter_key("typed"))]


@pytest.mark.parametrize("codec", ["json", "orjson"])
def test_types_survive_publish_handler_dead_letter_and_both_replays(redis, run_consumer, staff_client, settings, codec):
    settings.STREAMS = {**settings.STREAMS, "CODEC": codec}
    redis.set("typed:fail", "1")
    worker = run_consumer("typed:g", streams={"CODEC": codec, "RETRY_BACKOFF": 0.1})

    entry = publish("typed", typed_payload())
    assert seen(redis, 1) == expected()

    # A reader that knows nothing of Shoal reads the payload as plain JSON.
    [(_, fields)] = redis.xrange("typed", entry, entry)
    plain = json.loads(fields["payload"])
    assert plain["at"] == "2026-11-30T20:29:11.364826+00:00" and plain["total"] == "9.99"
    assert plain["id"] == "0b6c2a1e-3f4d-4c8e-9a7b-1d2e3f405162" and plain["items"][1]["at"] == "2026-01-01"
    assert plain["plain"] == {"n": 1, "s": "2026-01-01", "f": 1.5, "none": None}
    assert json.loads(fields["payload_types"])["/items/1/at"] == "date"

    # max_deliveries=1: dead-lettered, types description kept; the CLI replay brings the same types back.
    [letter] = dead(redis, 1)
    redis.delete("typed:fail")
    call_command("replay", "typed", "--group", "g", "--id", letter)
    assert seen(redis, 2) == expected()

    # The admin's edited replay: the operator changes a price; every type is kept.
    redis.set("typed:fail", "1")
    publish("typed", typed_payload())
    seen(redis, 3)
    [letter] = dead(redis, 1)
    redis.delete("typed:fail")
    mirror.sync_all()
    pk = DeadLetter.objects.get(entry_id=letter).pk
    client = staff_client("streams_app.replay_deadletter")
    url = f"/admin/streams_app/deadletter/{pk}/replay/"
    form = client.get(url).context
    edited = json.loads(form["payload_text"])
    edited["items"][0]["price"] = "2.75"
    types = form["types_text"]
    assert json.loads(types)["/total"] == "decimal"
    confirm = client.post(url, {"payload": json.dumps(edited), "payload_types": types})
    assert confirm.status_code == 200 and b"Are you sure?" in confirm.content
    done = client.post(url, {**dict(confirm.context["hidden"]), "post": "yes"})  # what the confirm page posts
    assert done.status_code == 302
    want = expected()
    want["items"][0]["price"] = ["Decimal", "Decimal('2.75')"]
    assert seen(redis, 4) == want
    assert redis.xlen(keys.dead_letter_key("typed")) == 0, redis.xrange(keys.dead_letter_key("typed"))
    worker.signal(15)
    assert worker.wait(60) == 0, worker.output()


def test_edited_replay_refuses_types_that_do_not_fit_and_replays_nothing(redis, staff_client):
    redis.xadd(keys.dead_letter_key("typed"), {"payload": '{"at":"2026-01-01"}', "payload_types": '{"/at":"date"}',
                                               "origin_stream": "typed", "origin_id": "1-0", "group": "g",
                                               "error": "RuntimeError: x", "deliveries": "1"})
    mirror.sync_all()
    pk = DeadLetter.objects.get().pk
    client = staff_client("streams_app.replay_deadletter")
    url = f"/admin/streams_app/deadletter/{pk}/replay/"
    bad = client.post(url, {"payload": '{"at": "tomorrow"}', "payload_types": '{"/at": "date"}', "post": "yes"})
    assert bad.status_code == 400 and b"&#x27;tomorrow&#x27; at &#x27;/at&#x27; is not a date" in bad.content
    gone = client.post(url, {"payload": '{"when": "2026-01-01"}', "payload_types": '{"/at": "date"}', "post": "yes"})
    assert gone.status_code == 400 and b"is not in the payload" in gone.content
    assert redis.xlen(keys.dead_letter_key("typed")) == 1 and redis.xlen("typed") == 0


def test_an_async_handler_gets_the_same_types(redis, run_consumer):
    worker = run_consumer("atyped:g")
    publish("atyped", typed_payload())
    assert seen(redis, 1) == expected()
    worker.signal(15)
    assert worker.wait(60) == 0, worker.output()
