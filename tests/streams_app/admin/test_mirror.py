"""The admin's mirror of Redis: streams, groups and dead letters copied (incrementally) into the database."""
import pytest

from streams_app import publish_many
from streams_app.redis import keys

from streams_app.admin import mirror
from streams_app.admin.charts import series_from
from streams_app.models import ConsumerGroup, DeadLetter, GroupSnapshot, MirrorState, Stream
from streams_app.operations.reclaim import Reclaimer
from streams_app.registry import select
from tests.streams_app.admin.fixtures import dead_letter, pending
from datetime import UTC

pytestmark = [pytest.mark.django_db, pytest.mark.both_redis]


def test_groups_mirror_lag_pending_consumers_and_the_declared_handler(redis):
    redis.xgroup_create("jobs", "a", id="0", mkstream=True)
    publish_many("jobs", [{"n": n} for n in range(10)])
    pending(redis, "jobs", "a", [{"n": 10}, {"n": 11}])  # group a reads 2 of the 12 entries
    redis.xgroup_create("jobs", "undeclared", id="0")
    mirror.sync_all()
    a = ConsumerGroup.objects.get(stream__name="jobs", name="a")
    assert (a.lag, a.pending, a.consumers, a.entries_read) == (10, 2, 1, 2)
    assert a.handler == "tests.testapp.consumers.behave" and a.max_deliveries == 5
    other = ConsumerGroup.objects.get(stream__name="jobs", name="undeclared")
    assert (other.lag, other.pending, other.handler, other.max_deliveries) == (12, 0, "", None)
    stream = Stream.objects.get(name="jobs")
    assert (stream.length, stream.groups, stream.exists) == (12, 2, True)
    assert MirrorState.objects.get(name="streams").error == ""

    redis.xgroup_destroy("jobs", "undeclared")
    redis.delete("jobs")
    mirror.sync_all()
    stream.refresh_from_db()
    assert not stream.exists and stream.length == 0
    assert not ConsumerGroup.objects.filter(stream=stream).exists()


def test_dead_letters_are_copied_by_id_and_vanished_ones_dropped(redis):
    first = dead_letter(redis, [{"order": 1}, {"order": 2}, {"order": 3}])
    mirror.sync_all()
    assert sorted(DeadLetter.objects.values_list("entry_id", flat=True)) == sorted(first)
    row = DeadLetter.objects.get(entry_id=first[0])
    assert (row.group, row.error_type, row.deliveries, row.payload) == ("a", "RuntimeError", 1, '{"order":1}')
    assert row.failed_at is not None and "Traceback" in row.traceback
    # A row is never re-read once copied: the sync reads past the cursor only.
    DeadLetter.objects.filter(entry_id=first[0]).update(error="edited in the copy")
    second = dead_letter(redis, [{"order": 4}])
    mirror.sync_all()
    assert DeadLetter.objects.get(entry_id=first[0]).error == "edited in the copy"
    assert Stream.objects.get(name="jobs").dlq_cursor == second[0]
    assert DeadLetter.objects.count() == 4
    # Replayed or deleted elsewhere: the copy follows.
    redis.xdel(keys.dead_letter_key("jobs"), first[1])
    mirror.sync_all()
    assert sorted(DeadLetter.objects.values_list("entry_id", flat=True)) == sorted([first[0], first[2], second[0]])


def test_a_recreated_dead_letter_stream_is_copied_from_its_start(redis):
    dead_letter(redis, [{"order": 1}])
    mirror.sync_all()
    redis.delete(keys.dead_letter_key("jobs"))
    redis.xadd(keys.dead_letter_key("jobs"), {"payload": "{}", "group": "a", "error": "x"}, id="1-1")
    mirror.sync_all()
    assert list(DeadLetter.objects.values_list("entry_id", flat=True)) == ["1-1"]


def test_the_reclaim_pass_syncs_the_mirror_and_records_entries_read(redis, settings):
    pending(redis, "jobs", "a", [{"n": 1}])
    dead_letter(redis, [{"n": 2}], stream="failing", group="g")
    report = Reclaimer(select(["jobs:a", "failing:g"]), conn=redis).tick()
    assert not report.errors
    assert ConsumerGroup.objects.get(stream__name="jobs", name="a").pending == 1
    assert DeadLetter.objects.filter(stream="failing").count() == 1
    assert GroupSnapshot.objects.get(stream="jobs", group="a").entries_read == 1


def test_a_failed_sync_is_recorded_and_try_sync_returns_the_last_good_copy(redis, redis_factory, use_redis):
    mirror.sync_all()
    good = MirrorState.objects.get(name="streams").synced_at
    dead = redis_factory()
    use_redis(dead)
    dead.stop()
    state = mirror.try_sync()
    assert state.synced_at == good and "ConnectionError" in state.error


def test_throughput_is_the_rate_of_acknowledged_entries():
    from datetime import datetime, timedelta

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [GroupSnapshot(taken_at=t0, lag=100, pending=0, consumers=1, dead_letters=0, entries_read=0),
            GroupSnapshot(taken_at=t0 + timedelta(minutes=2), lag=40, pending=20, consumers=1, dead_letters=0, entries_read=60)]
    series = series_from(rows)
    assert series["acked / min"] == [(t0 + timedelta(minutes=2), 20.0)]  # (60 read - 20 pending) / 2 min
    assert series["lag"] == [(t0, 100), (t0 + timedelta(minutes=2), 40)]


def test_a_page_copies_a_bounded_number_of_new_dead_letters_and_the_daemon_the_rest(redis, monkeypatch):
    monkeypatch.setattr(mirror, "PAGE_DLQ_LIMIT", 500)
    dead_letter(redis, [{"n": n} for n in range(1200)])
    mirror.try_sync()
    assert DeadLetter.objects.count() == 500
    mirror.try_sync()
    assert DeadLetter.objects.count() == 1000
    mirror.sync_all()
    assert DeadLetter.objects.count() == 1200
