"""Entries and keys the mirror cannot take as they are: one of them never takes down a page, a
reclaim pass or another stream's copy; null lag is estimated, never zero (issue 23)."""
import pytest

from streams_app import publish_many
from streams_app.redis import keys
from streams_app.admin import mirror
from streams_app.metrics.consumer import BacklogCollector
from streams_app.models import ConsumerGroup, DeadLetter, MirrorState, Stream
from streams_app.operations.reclaim import Reclaimer
from streams_app.registry import ConsumerSpec, _registry, select
from tests.streams_app.admin.fixtures import pending, staff_client  # noqa: F401

pytestmark = pytest.mark.django_db

PAGES = ["/admin/", "/admin/streams_app/deadletter/", "/admin/streams_app/stream/", "/admin/streams_app/consumergroup/"]


def raw_dead_letter(redis, stream, payload, group="a"):
    """A dead letter as a foreign producer's entry would become one: its payload bytes kept as they are."""
    return redis.xadd(keys.dead_letter_key(stream), {"payload": payload, "shoal:group": group, "shoal:origin_id": "1-0",
                                                     "shoal:error": "decode: not JSON", "shoal:deliveries": "1"})


def test_invalid_utf8_in_a_dead_letter_is_shown_escaped_and_pages_work(staff_client, redis):
    entry = raw_dead_letter(redis, "jobs", b"\xc3\x28 caf\xe9")
    client = staff_client()
    for url in PAGES:
        assert client.get(url).status_code == 200, url
    letter = DeadLetter.objects.get(entry_id=entry)
    assert letter.payload == "\\xc3( caf\\xe9"
    page = client.get(f"/admin/streams_app/deadletter/{letter.pk}/change/")
    assert page.status_code == 200 and "caf\\xe9" in page.content.decode()
    assert Reclaimer(select(["jobs:a"])).tick().errors == []


def test_a_nul_character_is_stored_escaped(redis):
    entry = raw_dead_letter(redis, "jobs", "id=7\x00name=x")
    mirror.sync_all()
    assert DeadLetter.objects.get(entry_id=entry).payload == "id=7\\x00name=x"


def test_one_stream_failing_to_sync_does_not_stop_the_others_and_the_failure_is_shown(staff_client, redis, monkeypatch):
    raw_dead_letter(redis, "failing", "{}", group="g")
    raw_dead_letter(redis, "jobs", "{}")
    real = mirror.sync_dead_letters

    def broken_for_failing(stream, **kwargs):
        if stream.name == "failing":
            raise ValueError("simulated bad row")
        return real(stream, **kwargs)

    monkeypatch.setattr(mirror, "sync_dead_letters", broken_for_failing)
    client = staff_client()
    page = client.get("/admin/streams_app/deadletter/")
    assert page.status_code == 200
    assert DeadLetter.objects.filter(stream="jobs").count() == 1  # sorted after "failing", copied all the same
    state = MirrorState.objects.get(name="streams")
    assert "failing" in state.error and "simulated bad row" in state.error
    assert "simulated bad row" in page.content.decode()
    assert "just now" not in page.content.decode()


def test_a_handler_that_is_a_callable_object_or_a_partial_does_not_break_the_mirror(staff_client, redis, monkeypatch):
    import functools

    class Handler:
        def __call__(self, message):
            pass

    monkeypatch.setitem(_registry, ("shapes", "obj"), ConsumerSpec("shapes", "obj", Handler()))
    monkeypatch.setitem(_registry, ("shapes", "part"), ConsumerSpec("shapes", "part", functools.partial(print, end="")))
    redis.xgroup_create("shapes", "obj", id="0", mkstream=True)
    redis.xgroup_create("shapes", "part", id="0")
    client = staff_client()
    for url in PAGES:
        assert client.get(url).status_code == 200, url
    handlers = dict(ConsumerGroup.objects.filter(stream__name="shapes").values_list("name", "handler"))
    assert handlers["obj"].endswith("Handler instance")
    assert handlers["part"] == "functools.partial(builtins.print, end='')"
    assert Reclaimer(select(["shapes:obj", "shapes:part"])).tick().errors == []


def test_a_registered_stream_name_holding_a_string_is_skipped_by_the_reclaimer_and_shown(staff_client, redis, caplog):
    redis.set("jobs", "x")
    pending(redis, "failing", "g", [{"n": 1}])
    redis.xgroup_create("ledger", "fast", id="0", mkstream=True)
    reclaimer = Reclaimer(select(["jobs:a", "failing:g", "ledger:fast"]))
    for _ in range(2):
        report = reclaimer.tick()
    assert any("jobs" in e and "holds a string" in e for e in report.errors)
    assert caplog.text.count("holds a string, not a stream") == 1  # logged once, not every pass
    assert ConsumerGroup.objects.filter(stream__name="failing", name="g").exists()  # the others were done
    stream = Stream.objects.get(name="jobs")
    assert not stream.exists and "holds a string" in stream.problem
    page = staff_client().get("/admin/streams_app/stream/").content.decode()
    assert "holds a string, not a stream" in page
    assert redis.get("jobs") == "x"


def test_null_lag_is_estimated_and_marked_in_the_admin_and_the_metrics(staff_client, redis, settings):
    settings.STREAMS = {**settings.STREAMS, "TARGET_LAG": 5}
    redis.xgroup_create("jobs", "a", id="0", mkstream=True)
    ids = publish_many("jobs", [{"n": n} for n in range(10)])
    redis.xdel("jobs", ids[3])  # an unread entry deleted: Redis reports lag as null
    assert redis.xinfo_groups("jobs")[0]["lag"] is None
    page = staff_client().get("/admin/").content.decode()
    group = ConsumerGroup.objects.get(stream__name="jobs", name="a")
    assert (group.lag, group.lag_estimated) == (9, True)
    assert "jobs:a</a> (~9, estimated)" in page
    changelist = staff_client().get("/admin/streams_app/consumergroup/").content.decode()
    assert "~9 (estimated)" in changelist
    families = {f.name: f for f in BacklogCollector(select(["jobs:a"])).collect()}
    [lag] = families["shoal_group_lag"].samples
    [estimated] = families["shoal_group_lag_estimated"].samples
    assert lag.value == 9 and estimated.value == 1


def test_a_pending_entry_with_invalid_utf8_shows_escaped_on_the_pending_page(staff_client, redis_server, redis):
    import redis as redis_py

    raw = redis_py.Redis(port=redis_server.port)
    raw.xgroup_create("jobs", "a", id="$", mkstream=True)
    raw.xadd("jobs", {"payload": b"\xc3\x28 caf\xe9"})
    raw.xreadgroup("a", b"c\xff1", {"jobs": ">"})  # a consumer name that is not UTF-8 either
    client = staff_client()
    assert client.get("/admin/").status_code == 200
    group = ConsumerGroup.objects.get(stream__name="jobs", name="a")
    page = client.get(f"/admin/streams_app/consumergroup/{group.pk}/pending/")
    assert page.status_code == 200
    assert "\\xc3( caf\\xe9" in page.content.decode()
    assert client.get(f"/admin/streams_app/consumergroup/{group.pk}/change/").status_code == 200
