"""The control room through Django's test client: pages, permissions, confirmations, Redis effects, audit."""
import json
import re
from pathlib import Path

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry

from streams_app.redis import keys

from streams_app.admin import mirror
from streams_app.redis.connection import node_client
from streams_app.models import ConsumerGroup, DeadLetter, GroupSnapshot
from tests.streams_app.admin.fixtures import dead_letter, pending, staff_client  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.both_redis]

CHANGELIST = "/admin/streams_app/deadletter/"


def dlq(redis, stream="jobs"):
    return [i for i, _ in redis.xrange(keys.dead_letter_key(stream))]


def rows(*entry_ids):
    mirror.sync_all()
    return [DeadLetter.objects.get(entry_id=i).pk for i in entry_ids]


def action(name, pks, **extra):
    return {"action": name, "_selected_action": [str(p) for p in pks], **extra}


# -- who may see what ----------------------------------------------------------------------------

def test_anonymous_users_are_sent_to_the_login_page(client, redis):
    [entry] = dead_letter(redis, [{"n": 1}])
    [pk] = rows(entry)
    group = ConsumerGroup.objects.get(name="a").pk
    for url in ["/admin/", CHANGELIST, f"{CHANGELIST}{pk}/change/", f"{CHANGELIST}{pk}/replay/",
                "/admin/streams_app/stream/", "/admin/streams_app/consumergroup/",
                f"/admin/streams_app/consumergroup/{group}/change/", f"/admin/streams_app/consumergroup/{group}/pending/",
                "/admin/discovery_app/serviceinstance/"]:
        response = client.get(url)
        assert response.status_code == 302 and response.url.startswith("/admin/login/"), url
    response = client.post(CHANGELIST, action("replay_selected", [pk], post="yes"))
    assert response.status_code == 302 and response.url.startswith("/admin/login/")
    assert dlq(redis) == [entry]


def test_pages_render_with_their_mirror_age_and_without_mutating_actions_for_read_only_staff(staff_client, redis):
    [entry] = dead_letter(redis, [{"customer": "ACME", "amount": 12}])
    client = staff_client()
    page = client.get(CHANGELIST)
    assert page.status_code == 200
    html = page.content.decode()
    assert entry in html and "Copied from Redis at" in html
    assert "replay_selected" not in html and "delete_selected_dead_letters" not in html
    pk = DeadLetter.objects.get(entry_id=entry).pk
    detail = client.get(f"{CHANGELIST}{pk}/change/").content.decode()
    assert "&quot;customer&quot;: &quot;ACME&quot;" in detail and "Traceback (most recent call last)" in detail
    assert "Replay with edited payload" not in detail
    for url in ["/admin/streams_app/stream/", "/admin/streams_app/consumergroup/", "/admin/"]:
        assert client.get(url).status_code == 200, url


def test_search_and_filters_find_a_failed_message_by_payload_and_error(staff_client, redis):
    [acme] = dead_letter(redis, [{"customer": "ACME"}])
    [other] = dead_letter(redis, [{"customer": "Initech"}], group="b", error="KeyError: 'sku'")
    client = staff_client()
    client.get(CHANGELIST)  # syncs
    found = client.get(CHANGELIST, {"q": "ACME"}).context["cl"].result_list
    assert [d.entry_id for d in found] == [acme]
    assert [d.entry_id for d in client.get(CHANGELIST, {"q": "sku"}).context["cl"].result_list] == [other]
    assert [d.entry_id for d in client.get(CHANGELIST, {"group": "b"}).context["cl"].result_list] == [other]
    assert [d.entry_id for d in client.get(CHANGELIST, {"error_type": "RuntimeError"}).context["cl"].result_list] == [acme]


# -- replay and delete ---------------------------------------------------------------------------

def test_replay_needs_its_permission_and_refuses_with_403_leaving_redis_alone(staff_client, redis):
    [entry] = dead_letter(redis, [{"n": 1}])
    [pk] = rows(entry)
    client = staff_client("streams_app.delete_deadletter")  # another permission is not this one
    for data in (action("replay_selected", [pk], index="0"), action("replay_selected", [pk], post="yes")):
        assert client.post(CHANGELIST, data).status_code == 403
    assert client.get(f"{CHANGELIST}{pk}/replay/").status_code == 403
    assert client.post(f"{CHANGELIST}{pk}/replay/", {"payload": "{}", "post": "yes"}).status_code == 403
    assert dlq(redis) == [entry] and redis.xlen("jobs") == 1
    assert not LogEntry.objects.exists()


def test_replay_confirms_first_then_replays_to_the_group_with_an_audit_entry(staff_client, redis):
    entries = dead_letter(redis, [{"n": 1}, {"n": 2}])
    pks = rows(*entries)
    client = staff_client("streams_app.replay_deadletter")
    client.get(CHANGELIST, action("replay_selected", pks, post="yes"))  # a GET changes nothing (checked below)
    confirm = client.post(CHANGELIST, action("replay_selected", pks, index="0"))
    assert confirm.status_code == 200 and b"Are you sure?" in confirm.content
    assert b'name="post" value="yes"' in confirm.content and b"csrfmiddlewaretoken" in confirm.content
    assert dlq(redis) == entries and redis.xlen("jobs") == 2
    done = client.post(CHANGELIST, action("replay_selected", pks, post="yes"), follow=True)
    assert "Replayed 2 dead letters." in [str(m) for m in done.context["messages"]]
    assert dlq(redis) == []
    replayed = redis.xrange("jobs")[2:]
    assert [(f["shoal:target_group"], json.loads(f["payload"])["n"]) for _, f in replayed] == [("a", 1), ("a", 2)]
    logs = LogEntry.objects.filter(action_flag=CHANGE, object_id__in=[str(p) for p in pks])
    assert logs.count() == 2 and all("Replayed to group a of jobs as entry" in log.change_message for log in logs)
    assert not DeadLetter.objects.exists()


def test_replay_to_a_destroyed_group_is_refused_and_removes_nothing(staff_client, redis):
    entries = dead_letter(redis, [{"n": 1}, {"n": 2}])
    pks = rows(*entries)
    redis.xgroup_destroy("jobs", "a")
    client = staff_client("streams_app.replay_deadletter")
    done = client.post(CHANGELIST, action("replay_selected", pks, post="yes"), follow=True)
    assert any("group 'a' does not exist on stream 'jobs'" in str(m) for m in done.context["messages"])
    assert dlq(redis) == entries and redis.xlen("jobs") == 2
    assert DeadLetter.objects.filter(pk__in=pks).count() == 2
    edited = client.post(f"{CHANGELIST}{pks[0]}/replay/", {"payload": "{}", "post": "yes"}, follow=True)
    assert edited.status_code == 200 and dlq(redis) == entries and redis.xlen("jobs") == 2


def test_a_dead_letter_replayed_or_deleted_meanwhile_gets_a_message_not_a_500(staff_client, redis):
    gone, kept = dead_letter(redis, [{"n": 1}, {"n": 2}])
    pks = rows(gone, kept)
    redis.xdel(keys.dead_letter_key("jobs"), gone)  # someone else, after this page was rendered
    client = staff_client("streams_app.replay_deadletter", "streams_app.delete_deadletter")
    response = client.post(CHANGELIST, action("replay_selected", pks, post="yes"), follow=True)
    said = [str(m) for m in response.context["messages"]]
    assert "Replayed 1 dead letter." in said
    assert any("1 dead letter was no longer in Redis: replayed or deleted by someone else" in m for m in said)
    # And a row deleted from the copy meanwhile (another admin's action, then a sync).
    response = client.post(CHANGELIST, action("delete_selected_dead_letters", pks, post="yes"), follow=True)
    assert response.status_code == 200
    assert any("are gone: replayed or deleted by someone else meanwhile" in str(m) for m in response.context["messages"])
    letter = pks[0]
    assert client.get(f"{CHANGELIST}{letter}/change/").status_code == 404
    assert client.get(f"{CHANGELIST}{letter}/replay/").status_code == 404


def test_delete_needs_its_permission_and_removes_from_redis_with_an_audit_entry(staff_client, redis):
    entries = dead_letter(redis, [{"n": 1}, {"n": 2}])
    pks = rows(*entries)
    refused = staff_client("streams_app.replay_deadletter")
    assert refused.post(CHANGELIST, action("delete_selected_dead_letters", pks, post="yes")).status_code == 403
    assert dlq(redis) == entries
    client = staff_client("streams_app.delete_deadletter")
    confirm = client.post(CHANGELIST, action("delete_selected_dead_letters", pks[:1], index="0"))
    assert b"cannot be replayed" in confirm.content and dlq(redis) == entries
    client.post(CHANGELIST, action("delete_selected_dead_letters", pks[:1], post="yes"))
    assert dlq(redis) == entries[1:]
    log = LogEntry.objects.get(action_flag=DELETION)
    assert log.object_id == str(pks[0]) and log.user.username == "staff1"


def test_replay_with_an_edited_payload_validates_json_confirms_and_replays_it(staff_client, redis):
    [entry] = dead_letter(redis, [{"sku": None, "qty": 1}])
    [pk] = rows(entry)
    client = staff_client("streams_app.replay_deadletter")
    url = f"{CHANGELIST}{pk}/replay/"
    form = client.get(url)
    assert form.status_code == 200 and b"&quot;sku&quot;: null" in form.content
    bad = client.post(url, {"payload": '{"sku": "A-1", '})
    assert bad.status_code == 400 and b"This is not valid JSON" in bad.content
    # A user trial: a 500 (RecursionError). Deeper than the json module parses on every supported Python.
    deep = client.post(url, {"payload": "[" * 200_000 + "]" * 200_000})
    assert deep.status_code == 400 and b"nested too deeply" in deep.content and dlq(redis) == [entry]
    confirm = client.post(url, {"payload": '{"sku": "A-1", "qty": 1}'})
    assert b"Are you sure?" in confirm.content and dlq(redis) == [entry]
    done = client.post(url, {"payload": '{"sku": "A-1", "qty": 1}', "post": "yes"})
    assert done.status_code == 302 and dlq(redis) == []
    [(_, fields)] = redis.xrange("jobs")[1:]
    assert json.loads(fields["payload"]) == {"sku": "A-1", "qty": 1} and fields["shoal:target_group"] == "a"
    assert "edited payload" in LogEntry.objects.get(object_id=str(pk)).change_message


def test_replay_all_matching_the_filter_covers_thousands_and_only_the_filter(staff_client, redis):
    dead_letter(redis, [{"n": n} for n in range(1200)])
    in_b = dead_letter(redis, [{"n": n} for n in range(3)], group="b")
    client = staff_client("streams_app.replay_deadletter")
    client.get(CHANGELIST)
    one = DeadLetter.objects.filter(group="a").first().pk
    # The changelist posts the visible selection plus select_across=1 ("select all 1200").
    confirm = client.post(f"{CHANGELIST}?group=a", action("replay_selected", [one], index="0", select_across="1"))
    html = confirm.content.decode()
    assert "<strong>1200</strong> items: every one matching the current filter" in html
    assert html.count('name="_selected_action"') == 1  # the filter is posted back, not 1200 ids
    client.post(f"{CHANGELIST}?group=a", action("replay_selected", [one], index="0", select_across="1", post="yes"))
    assert dlq(redis) == in_b
    assert sum(1 for _, f in redis.xrange("jobs") if f.get("shoal:target_group") == "a") == 1200
    assert LogEntry.objects.count() == 1200


def test_malformed_ids_are_404s(staff_client, redis):
    client = staff_client("streams_app.replay_deadletter")
    assert client.get(f"{CHANGELIST}abc/change/").status_code == 404
    assert client.get(f"{CHANGELIST}99999/change/").status_code == 404
    assert client.get(f"{CHANGELIST}abc/replay/").status_code == 404
    assert client.post(CHANGELIST, action("replay_selected", ["1;DROP"], index="0")).status_code == 404


# -- groups, pending entries ----------------------------------------------------------------------

def test_group_page_lists_consumers_and_draws_the_snapshot_chart(staff_client, redis):
    from datetime import timedelta

    from django.utils import timezone

    pending(redis, "jobs", "a", [{"n": 1}, {"n": 2}], consumer="worker-1")
    now = timezone.now()
    GroupSnapshot.objects.bulk_create([
        GroupSnapshot(stream="jobs", group="a", taken_at=now - timedelta(minutes=m), lag=m * 10, pending=2,
                      consumers=1, dead_letters=0, entries_read=100 - m) for m in (30, 20, 10)
    ])
    client = staff_client()
    client.get("/admin/streams_app/consumergroup/")
    group = ConsumerGroup.objects.get(stream__name="jobs", name="a")
    html = client.get(f"/admin/streams_app/consumergroup/{group.pk}/change/").content.decode()
    assert "worker-1" in html and "<svg" in html and 'data-series="lag"' in html and 'data-series="acked / min"' in html
    assert "Copied from Redis at" in html


def test_the_pending_page_reads_one_page_of_100000_entries(staff_client, redis):
    pipe = redis.pipeline(transaction=False)
    for n in range(100_000):
        pipe.xadd("jobs", {"payload": json.dumps({"n": n})})
        if n % 10_000 == 9_999:
            pipe.execute()
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "c1", {"jobs": ">"}, count=100_000)
    client = staff_client()
    mirror.sync_all()
    group = ConsumerGroup.objects.get(name="a")
    assert group.pending == 100_000
    node = node_client(redis, "jobs")  # command statistics are per node
    node.config_resetstat()
    page = client.get(f"/admin/streams_app/consumergroup/{group.pk}/pending/")
    stats = node.info("commandstats")
    assert page.status_code == 200
    assert len(page.context["entries"]) == 50 and page.context["total"] == 100_000
    # One XPENDING summary, one XPENDING page of 51 (50 + "is there more?"), one XRANGE per shown payload.
    assert stats["cmdstat_xpending"]["calls"] == 2
    assert stats["cmdstat_xrange"]["calls"] == 50
    assert "cmdstat_xreadgroup" not in stats and "cmdstat_xautoclaim" not in stats
    second = client.get(page.context["next_url"] and f"/admin/streams_app/consumergroup/{group.pk}/pending/" + page.context["next_url"])
    first_ids = [e["id"] for e in page.context["entries"]]
    assert second.context["entries"][0]["id"] == redis.xrange("jobs", count=51)[50][0]
    assert not set(first_ids) & {e["id"] for e in second.context["entries"]}


def pending_post(client, group, name, ids, **extra):
    return client.post(f"/admin/streams_app/consumergroup/{group.pk}/pending/",
                       {"action": name, "entry": ids, **extra})


def test_pending_actions_need_their_permission_and_get_changes_nothing(staff_client, redis):
    ids = pending(redis, "jobs", "a", [{"n": 1}])
    redis.xgroup_createconsumer("jobs", "a", "c2")
    mirror.sync_all()
    group = ConsumerGroup.objects.get(name="a")
    client = staff_client("streams_app.claim_pending")
    for name in ("ack", "deadletter"):
        assert pending_post(client, group, name, ids, post="yes").status_code == 403
    assert client.get(f"/admin/streams_app/consumergroup/{group.pk}/pending/",
                      {"action": "claim", "entry": ids, "consumer": "c2", "post": "yes"}).status_code == 200
    assert redis.xpending("jobs", "a")["pending"] == 1 and dlq(redis) == []
    assert redis.xpending_range("jobs", "a", "-", "+", 1)[0]["consumer"] == "c1"
    assert not LogEntry.objects.exists()


def test_ack_claim_and_dead_letter_pending_entries_after_confirming(staff_client, redis):
    ids = pending(redis, "jobs", "a", [{"n": n} for n in range(4)])
    redis.xgroup_createconsumer("jobs", "a", "c2")  # a second consumer to claim to
    mirror.sync_all()
    group = ConsumerGroup.objects.get(name="a")
    client = staff_client("streams_app.claim_pending", "streams_app.ack_pending", "streams_app.deadletter_pending")

    confirm = pending_post(client, group, "ack", ids[:1])
    assert b"Acknowledging skips processing" in confirm.content and redis.xpending("jobs", "a")["pending"] == 4
    pending_post(client, group, "ack", ids[:1], post="yes")
    assert redis.xpending("jobs", "a")["pending"] == 3

    pending_post(client, group, "claim", ids[1:2], consumer="c2", post="yes")
    [row] = redis.xpending_range("jobs", "a", ids[1], ids[1], 1)
    assert row["consumer"] == "c2" and row["times_delivered"] == 1
    assert pending_post(client, group, "claim", ids[1:2], consumer="nobody", post="yes").status_code == 302
    assert redis.xpending_range("jobs", "a", ids[1], ids[1], 1)[0]["consumer"] == "c2"

    response = pending_post(client, group, "deadletter", ids[2:], post="yes")
    assert response.status_code == 302
    letters = redis.xrange(keys.dead_letter_key("jobs"))
    assert [f["shoal:origin_id"] for _, f in letters] == ids[2:]
    assert "by staff0 from the admin" in letters[0][1]["shoal:error"]
    messages = [log.change_message for log in LogEntry.objects.filter(object_id=str(group.pk)).order_by("pk")]
    assert messages == [f"Acknowledged pending entry {ids[0]}", f"Claimed pending entry {ids[1]} to consumer c2",
                        f"Moved to the dead letters pending entry {ids[2]}", f"Moved to the dead letters pending entry {ids[3]}"]

    # Acked by a worker meanwhile: said so, nothing done.
    redis.xack("jobs", "a", ids[1])
    done = pending_post(client, group, "ack", ids[1:2], post="yes")
    followed = client.get(done.url)
    assert any("no longer pending" in str(m) for m in followed.context["messages"])


def test_pending_page_rejects_malformed_ids_and_unknown_groups(staff_client, redis):
    pending(redis, "jobs", "a", [{"n": 1}])
    mirror.sync_all()
    group = ConsumerGroup.objects.get(name="a")
    client = staff_client("streams_app.ack_pending")
    base = f"/admin/streams_app/consumergroup/{group.pk}/pending/"
    assert client.get(base, {"after": "nope"}).status_code == 404
    assert pending_post(client, group, "ack", ["0-0; FLUSHALL"], post="yes").status_code == 404
    assert pending_post(client, group, "explode", ["1-0"]).status_code == 404
    assert client.get("/admin/streams_app/consumergroup/999/pending/").status_code == 404
    assert redis.xpending("jobs", "a")["pending"] == 1


def test_the_index_summarises_lag_stale_pending_and_dead_letters(staff_client, redis, settings):
    settings.STREAMS = {"PENDING_TIMEOUT_MS": 0}
    from streams_app import publish_many

    pending(redis, "jobs", "a", [{"n": 1}])
    publish_many("jobs", [{"n": n} for n in range(150)])
    dead_letter(redis, [{"n": 2}], stream="failing", group="g")
    html = staff_client().get("/admin/").content.decode()
    summary = html[html.index('id="shoal-summary"'):]
    assert "jobs:a</a> (" in summary.split("Pending older")[0]  # lag 150 > 100
    assert "/pending/" in summary and "failing</a> (1)" in summary


def test_with_redis_down_pages_and_actions_say_so_instead_of_a_500(staff_client, redis_factory, use_redis):
    server = redis_factory()
    use_redis(server)
    client_redis = server.client()
    [entry] = dead_letter(client_redis, [{"n": 1}])
    [pk] = rows(entry)
    pending(client_redis, "jobs", "a", [{"n": 2}])
    mirror.sync_all()
    group = ConsumerGroup.objects.get(stream__name="jobs", name="a").pk
    client = staff_client("streams_app.replay_deadletter", "streams_app.ack_pending")
    server.stop()

    page = client.get(f"/admin/streams_app/consumergroup/{group}/pending/")
    assert page.status_code == 200 and any("Redis is unreachable" in str(m) for m in page.context["messages"])
    response = client.post(CHANGELIST, action("replay_selected", [pk], post="yes"), follow=True)
    assert response.status_code == 200
    assert any("before Redis failed" in str(m) for m in response.context["messages"])
    edited = client.post(f"{CHANGELIST}{pk}/replay/", {"payload": '{"n": 3}', "post": "yes"})
    assert edited.status_code == 302
    assert client.get(f"/admin/streams_app/consumergroup/{group}/change/").status_code == 200


TOUR_GROUP = re.compile(r"\*Consumer groups\* → `(?P<row>[^`]+)`(?P<rest>[^\n]*\n[^\n]*)")


def test_the_readmes_tour_names_the_group_as_the_admin_shows_it(staff_client, redis):
    # A user trial: the tour said `orders · email`; the list shows `email` (stream `orders`) and the
    # group's page is titled `orders:email`.
    pending(redis, "orders", "email", [{"order_id": 1}])
    pending(redis, "orders", "points", [{"order_id": 1}])
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    tour = TOUR_GROUP.search(readme)
    assert tour, "the README's tour names no consumer group"
    client = staff_client()
    listing = client.get("/admin/streams_app/consumergroup/").content.decode()
    link = re.search(rf'<a href="(?P<url>[^"]+)">{re.escape(tour["row"])}</a>', listing)
    assert link, f"no row of the consumer groups list is shown as {tour['row']!r}"
    row = listing[link.start():listing.index("</tr>", link.start())]
    for stream in re.findall(r"stream `([^`]+)`", tour["rest"]):
        assert f">{stream}<" in row, f"the {tour['row']!r} row does not show stream {stream!r}"
    page = client.get(link["url"]).content.decode()
    for title in re.findall(r"titled `([^`]+)`", tour["rest"]):
        assert f"<h2>{title}</h2>" in page, f"the group's page is not titled {title!r}"
