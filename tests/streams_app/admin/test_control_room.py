"""Control room 2 (issue 16): per-group dead letters, consumer liveness, why an entry is pending, retry now."""
import json

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User

from streams_app import publish, publish_many
from streams_app.redis import keys
from streams_app.admin import mirror
from streams_app.consuming.groups import ensure_group
from streams_app.models import ConsumerGroup, DeadLetter
from tests.streams_app.admin.fixtures import dead_letter, pending, staff_client  # noqa: F401
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db

GROUPS = "/admin/streams_app/consumergroup/"


@pytest.mark.both_redis
def test_each_group_counts_its_own_dead_letters_not_the_whole_streams(staff_client, redis):
    dead_letter(redis, [{"n": 1}, {"n": 2}], group="a")
    dead_letter(redis, [{"n": 3}], group="b")
    pending(redis, "jobs", "c", [{"n": 4}])
    client = staff_client()
    page = client.get(GROUPS)
    counts = {g.name: g.dead_letters for g in page.context["cl"].result_list}
    assert counts == {"a": 2, "b": 1, "c": 0}
    assert 'href="/admin/streams_app/deadletter/?stream=jobs&amp;group=b">1</a>' in page.content.decode()
    # A letter replayed or deleted elsewhere leaves its group's count at the next copy.
    redis.xtrim("{jobs}:dlq", maxlen=0)
    mirror.sync_all()
    assert dict(ConsumerGroup.objects.values_list("name", "dead_letters")) == {"a": 0, "b": 0, "c": 0}


# -- a failing entry, its consumer killed: see it, retry it now, claim it to a live consumer --------------

# The back-off (300 s) and pending timeout (600 s) are far beyond the test: only the admin's actions
# can have the entry delivered again within it. CONSUMER_TTL 1.5 s: a killed consumer is dead soon.
SLOW_RETRIES = {"RETRY_BACKOFF": 300, "PENDING_TIMEOUT_MS": 600_000, "CLAIM_INTERVAL_MS": 200, "CONSUMER_TTL": 1.5}


def started(redis, entry_id):
    return redis.lrange("started:jobs:a", 0, -1).count(entry_id)


def live_names(redis):
    now_ms = int(redis.time()[0]) * 1000
    return {name for name, deadline in redis.hgetall(keys.liveness_key("jobs")).items() if int(deadline) > now_ms}


def act(client, group, name, ids, **extra):
    url = f"{GROUPS}{group.pk}/pending/"
    confirm = client.post(url, {"action": name, "entry": ids, **extra})
    assert confirm.status_code == 200 and b"Are you sure?" in confirm.content, confirm.content[:2000]
    return client.post(url, {"action": name, "entry": ids, "post": "yes", **extra}, follow=True)


@pytest.mark.slow
def test_an_operator_sees_why_an_entry_is_stuck_retries_it_now_and_claims_it_from_a_killed_consumer(
        staff_client, redis, run_consumer, settings):
    settings.STREAMS = SLOW_RETRIES
    ensure_group(redis, "jobs", "a", start="$")
    first = run_consumer("jobs:a", streams=SLOW_RETRIES)
    first.wait_for_output("started", timeout=60)
    [entry] = publish_many("jobs", [{"fail": "boom"}])
    wait_for(lambda: redis.hget(keys.error_key("jobs", "a", entry), "error"), timeout=30, what="the failure recorded")
    client = staff_client("streams_app.retry_pending", "streams_app.claim_pending")
    client.get(GROUPS)  # copies the group into the mirror
    group = ConsumerGroup.objects.get(name="a")
    page = client.get(f"{GROUPS}{group.pk}/pending/")
    [row] = page.context["entries"]
    assert "RuntimeError: asked to fail: boom" in row["error"] and row["liveness"] == "alive"
    assert 250 < row["due_in"] <= 300  # its owner retries it after the 300 s back-off

    # Retry now: its live owner takes it at its next claim pass, not in 300 s.
    done = act(client, group, "retry", [entry])
    assert "Made due now 1 pending entry of jobs:a." in [str(m) for m in done.context["messages"]]
    wait_for(lambda: started(redis, entry) == 2, timeout=20, what="the entry delivered again")
    assert LogEntry.objects.filter(change_message=f"Made due now pending entry {entry}").exists()

    # Its consumer is SIGKILLed: the group's page and list say so once its deadline lapses.
    first.kill()
    wait_for(lambda: not live_names(redis), timeout=20, what="the killed consumer's deadline to lapse")
    mirror.sync_all()
    assert client.get(GROUPS).context["cl"].result_list[0].live_consumers == 0
    assert "0 alive of 1" in client.get(GROUPS).content.decode()
    detail = client.get(f"{GROUPS}{group.pk}/change/")
    [dead] = detail.context["consumers"]
    assert dead.liveness == "dead" and dead.pending == 1

    # A new consumer that has read nothing yet is offered as a claim target; claiming makes the entry due.
    second = run_consumer("jobs:a", streams=SLOW_RETRIES)
    second.wait_for_output("started", timeout=60)
    wait_for(lambda: live_names(redis), timeout=20, what="the second consumer's deadline")
    [name] = live_names(redis)
    offered = client.get(f"{GROUPS}{group.pk}/pending/").context["consumers"]
    assert [c.name for c in offered if c.claimable] == [name]
    # The form sends "=" + name (any text can be a consumer's name, "" too: pending.owner_value).
    assert f'<option value="={name}">{name} (alive, new to the group)</option>' in client.get(
        f"{GROUPS}{group.pk}/pending/").content.decode()
    done = act(client, group, "claim", [entry], consumer=name)
    assert "Claimed 1 pending entry of jobs:a." in [str(m) for m in done.context["messages"]]
    wait_for(lambda: started(redis, entry) == 3, timeout=20, what="the claimed entry delivered")
    assert redis.xpending_range("jobs", "a", entry, entry, 1)[0]["consumer"] == name


@pytest.mark.both_redis
def test_the_pending_page_filters_by_owner_idle_and_deliveries_and_refuses_ids_past_64_bits(staff_client, redis):
    ids = pending(redis, "jobs", "a", [{"n": n} for n in range(3)], consumer="c1")
    ids += pending(redis, "jobs", "a", [{"n": n} for n in range(3, 5)], consumer="c2")
    redis.xclaim("jobs", "a", "c1", 0, [ids[0]], idle=200_000, retrycount=5, justid=True)
    redis.xclaim("jobs", "a", "c2", 0, [ids[4]], retrycount=3, justid=True)
    client = staff_client("streams_app.retry_pending")
    client.get(GROUPS)
    url = f"{GROUPS}{ConsumerGroup.objects.get(name='a').pk}/pending/"

    def shown(**params):
        return [e["id"] for e in client.get(url, params).context["entries"]]

    assert shown() == ids
    # At its delivery limit (jobs:a's max_deliveries is 5) and idle past the pending timeout.
    page = client.get(url)
    assert [e["to_dead_letters"] for e in page.context["entries"]] == [True, False, False, False, False]
    assert "to the dead letters at the next claim pass" in page.content.decode()
    assert shown(consumer="c2") == ids[3:]
    assert shown(min_idle="100") == ids[:1]
    assert shown(min_deliveries="3") == [ids[0], ids[4]]
    assert shown(consumer="c2", min_deliveries="3") == ids[4:]
    page = client.get(url, {"min_idle": "soon"})
    assert [e["id"] for e in page.context["entries"]] == ids
    assert any("min_idle='soon' is not a number" in str(m) for m in page.context["messages"])
    # Each part of an id is a 64-bit integer in Redis: one past it is a 404, like any malformed id.
    assert client.get(url, {"after": f"{2**64}-0"}).status_code == 404
    assert client.post(url, {"action": "retry", "entry": [f"{2**64}-0"], "post": "yes"}).status_code == 404
    assert client.post(url, {"action": "retry", "entry": [f"1-{2**64}"]}).status_code == 404


@pytest.mark.both_redis
def test_retry_now_needs_its_permission_and_claim_makes_entries_due_instead_of_resetting_them(staff_client, redis):
    [entry] = pending(redis, "jobs", "a", [{"n": 1}], consumer="c1")
    redis.xgroup_createconsumer("jobs", "a", "c2")
    client = staff_client("streams_app.claim_pending")
    client.get(GROUPS)
    url = f"{GROUPS}{ConsumerGroup.objects.get(name='a').pk}/pending/"
    assert client.post(url, {"action": "retry", "entry": [entry], "post": "yes"}).status_code == 403
    assert client.post(url, {"action": "claim", "entry": [entry], "consumer": "c2", "post": "yes"}).status_code == 302
    [row] = redis.xpending_range("jobs", "a", entry, entry, 1)
    # Past the pending timeout (30 s): the next claim pass takes it. A plain XCLAIM would set 0.
    assert row["consumer"] == "c2" and row["time_since_delivered"] > 30_000 and row["times_delivered"] == 1


# -- production hardening ----------------------------------------------------------------------------

def test_the_replay_permission_alone_does_not_show_a_dead_letters_payload(client, redis):
    [entry] = dead_letter(redis, [{"card": "4111-secret"}])
    mirror.sync_all()
    pk = DeadLetter.objects.get(entry_id=entry).pk
    user = User.objects.create_user("replayer", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="replay_deadletter"))
    client.force_login(user)
    page = client.get(f"/admin/streams_app/deadletter/{pk}/replay/")
    assert page.status_code == 403 and b"4111-secret" not in page.content
    assert client.post(f"/admin/streams_app/deadletter/{pk}/replay/", {"payload": "{}", "post": "yes"}).status_code == 403
    assert redis.xlen("{jobs}:dlq") == 1


def test_an_edited_replay_obeys_publishs_payload_limits(staff_client, redis, settings):
    [entry] = dead_letter(redis, [{"n": 1}])
    mirror.sync_all()
    url = f"/admin/streams_app/deadletter/{DeadLetter.objects.get(entry_id=entry).pk}/replay/"
    client = staff_client("streams_app.replay_deadletter")
    settings.STREAMS = {"MAX_PAYLOAD_BYTES": 1024}
    for payload, why in [(json.dumps({"blob": "x" * 2048}), "over the limit of 1024"), ('{"n": NaN}', "NaN")]:
        for extra in ({}, {"post": "yes"}):  # refused at the form and at the confirmed post alike
            page = client.post(url, {"payload": payload, "payload_types": "", **extra})
            assert page.status_code == 400 and why in page.context["error"], (payload[:20], extra)
    assert redis.xlen("{jobs}:dlq") == 1 and redis.xlen("jobs") == 1


def test_the_admin_says_shoal_control_room_has_no_view_site_link_and_a_content_security_policy(staff_client, redis):
    client = staff_client()
    page = client.get("/admin/")
    html = page.content.decode()
    assert "Shoal control room" in html and "View site" not in html
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert client.get("/").url == "/admin/"


def test_bulk_actions_work_through_every_matching_entry_on_the_server_not_the_pages_form(staff_client, redis):
    held = pending(redis, "jobs", "a", [{"n": n} for n in range(1200)], consumer="c1")
    others = pending(redis, "jobs", "a", [{"n": n} for n in range(5)], consumer="c2")
    redis.xclaim("jobs", "a", "c1", 0, held[:700], idle=200_000, justid=True)
    redis.xclaim("jobs", "a", "c2", 0, others[:2], idle=200_000, justid=True)
    client = staff_client("streams_app.ack_pending", "streams_app.retry_pending")
    client.get(GROUPS)
    url = f"{GROUPS}{ConsumerGroup.objects.get(name='a').pk}/pending/?consumer=c1&min_idle=100"
    assert len(client.get(url).context["entries"]) == 50  # one page of the 700 shown
    confirm = client.post(url, {"action": "ack", "select_across": "1"})
    assert confirm.status_code == 200 and confirm.context["count"] == 700
    assert b"owner c1, idle at least 100 s" in confirm.content and redis.xpending("jobs", "a")["pending"] == 1205
    done = client.post(url, {"action": "ack", "select_across": "1", "post": "yes"}, follow=True)
    assert "Acknowledged 700 pending entries of jobs:a." in [str(m) for m in done.context["messages"]]
    left = {r["message_id"] for r in redis.xpending_range("jobs", "a", "-", "+", 2000)}
    assert left == set(held[700:]) | set(others)  # c2's idle ones and c1's fresh ones untouched
    # One LogEntry per batch of 500, naming every entry of it.
    logs = LogEntry.objects.filter(change_message__startswith="Acknowledged ")
    assert [log.change_message.split(":")[0] for log in logs.order_by("pk")] == [
        "Acknowledged 500 pending entries matching owner c1, idle at least 100 s",
        "Acknowledged 200 pending entries matching owner c1, idle at least 100 s"]
    assert {i for log in logs for i in log.change_message.split(": ", 1)[1].split(", ")} == set(held[:700])

    everything = f"{GROUPS}{ConsumerGroup.objects.get(name='a').pk}/pending/"
    client.post(everything, {"action": "retry", "select_across": "1", "post": "yes"})
    rows = redis.xpending_range("jobs", "a", "-", "+", 2000)
    assert len(rows) == 505 and all(r["time_since_delivered"] > 30_000 for r in rows)


@pytest.mark.both_redis
def test_replay_all_of_a_groups_dead_letters_runs_in_the_reclaim_daemon_with_its_progress_shown(staff_client, redis):
    from streams_app.conf import get_settings
    from streams_app.redis.connection import get_connection
    from streams_app.models import ReplayJob
    from streams_app.operations.reclaim import Reclaimer
    from streams_app.registry import select

    dead_letter(redis, [{"n": n} for n in range(1200)], group="a")
    dead_letter(redis, [{"n": n} for n in range(3)], group="b")
    client = staff_client("streams_app.replay_deadletter")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    url = f"{GROUPS}{group.pk}/replay-dead-letters/"
    assert url in client.get(f"{GROUPS}{group.pk}/change/").content.decode()
    letters = client.get("/admin/streams_app/deadletter/", {"stream": "jobs", "group": "a"}).content.decode()
    assert url in letters and url not in client.get("/admin/streams_app/deadletter/").content.decode()
    confirm = client.get(url)
    assert b"Are you sure?" in confirm.content and not ReplayJob.objects.exists()
    queued = client.post(url, {"action": "replay_all", "post": "yes"}, follow=True)
    job = ReplayJob.objects.get()
    assert (job.stream, job.group, job.state) == ("jobs", "a", "queued")
    assert "waiting for the reclaim daemon" in queued.content.decode()
    assert redis.xlen("{jobs}:dlq") == 1203  # nothing replayed inside the request
    assert LogEntry.objects.filter(change_message__contains=f"(replay job {job.pk})").exists()
    # A second submit while that job waits queues nothing (it would replay again what fails again).
    again = client.post(url, {"action": "replay_all", "post": "yes"}, follow=True)
    assert ReplayJob.objects.count() == 1 and "already queued" in again.content.decode()

    Reclaimer(select(["jobs:a"]), conn=get_connection(), config=get_settings()).tick()
    job.refresh_from_db()
    assert (job.state, job.replayed, job.scanned, job.total) == ("done", 1200, 1203, 1203)
    assert redis.xlen("{jobs}:dlq") == 3  # group b's stay
    page = client.get(f"/admin/streams_app/replayjob/{job.pk}/change/").content.decode()
    assert "1203 of 1203 dead letters looked at (100%)" in page and 'http-equiv="refresh"' not in page
    # Only the replay permission may queue one.
    assert staff_client().post(url, {"action": "replay_all", "post": "yes"}).status_code == 403


def test_chart_axes_have_whole_number_ticks_for_counts_and_no_repeated_times(db):
    import re
    from datetime import timedelta

    from django.utils import timezone

    from streams_app.admin.charts import group_chart
    from streams_app.models import GroupSnapshot

    now = timezone.now()
    GroupSnapshot.objects.bulk_create([
        GroupSnapshot(stream="jobs", group="a", taken_at=now - timedelta(seconds=s), lag=3, pending=1, consumers=1,
                      dead_letters=1, entries_read=10) for s in (90, 60, 30)
    ])
    svg = group_chart("jobs", "a", hours=1, now=now)
    panels = dict(re.findall(r'class="title">([^<]+)</text>(.*?)(?=class="title">|</svg>)', svg))
    assert set(panels) == {"Backlog", "Throughput", "Dead letters"}
    for title in ("Backlog", "Dead letters"):  # counts: no 0.2 of a dead letter (throughput is a rate)
        ticks = re.findall(r'class="axis" text-anchor="end">([^<]+)<', panels[title])
        assert ticks and all(t.replace(",", "").isdigit() for t in ticks), (title, ticks)
    for body in panels.values():
        times = re.findall(r'class="axis time" text-anchor="middle">([^<]+)<', body)
        assert times and len(times) == len(set(times)), times


def test_a_dead_letters_page_has_replay_and_delete_buttons_and_an_edited_replay_audits_its_payload(staff_client, redis):
    first, second = dead_letter(redis, [{"n": 1}, {"n": 2}])
    mirror.sync_all()
    one, two = (DeadLetter.objects.get(entry_id=i).pk for i in (first, second))
    client = staff_client("streams_app.replay_deadletter")
    html = client.get(f"/admin/streams_app/deadletter/{one}/change/").content.decode()
    assert 'value="replay_selected"' in html and 'value="delete_selected_dead_letters"' not in html
    form = {"_selected_action": str(one), "index": "0", "action": "replay_selected"}
    confirm = client.post("/admin/streams_app/deadletter/", form)
    assert b"Are you sure?" in confirm.content and redis.xlen("{jobs}:dlq") == 2
    client.post("/admin/streams_app/deadletter/", {**form, "post": "yes"})
    assert [i for i, _ in redis.xrange("{jobs}:dlq")] == [second]

    client.post(f"/admin/streams_app/deadletter/{two}/replay/", {"payload": '{"n": 20}', "payload_types": "", "post": "yes"})
    log = LogEntry.objects.get(object_id=str(two))
    assert log.change_message.endswith('payload: {"n": 20}')


@pytest.mark.both_redis
def test_find_a_message_shows_where_it_is_in_every_group(staff_client, redis):
    from streams_app.deadletters import store as deadletters
    from streams_app.deadletters.replay import replay

    for group in ("a", "b", "c"):
        ensure_group(redis, "jobs", group, start="$")
    first, second = publish_many("jobs", [{"n": 1}, {"n": 2}])
    third = publish("jobs", {"n": 3}, key="order-3")
    redis.xreadgroup("a", "w1", {"jobs": ">"})
    redis.xack("jobs", "a", first, third)
    redis.xreadgroup("b", "w2", {"jobs": ">"}, count=1)
    deadletters.record_errors(redis, "jobs", "b", "w2", [(first, "KeyError: 'sku'", "")], ttl=60)
    deadletters.move(redis, "jobs", "a", [(second, "ValueError: bad", "")])
    [letter] = [i for i, _ in redis.xrange("{jobs}:dlq")]
    client = staff_client()
    client.get(GROUPS)
    page = client.get(f"{GROUPS}find/", {"stream": "jobs", "q": first})
    [found] = page.context["results"]
    states = {p.group: (p.state, p.detail) for p in found.places}
    assert states["a"][0] == "handled" and states["c"][0] == "not yet delivered"
    assert states["b"][0] == "pending" and "owner w2" in states["b"][1] and "KeyError: 'sku'" in states["b"][1]

    [found] = client.get(f"{GROUPS}find/", {"stream": "jobs", "q": second}).context["results"]
    assert found.places[0].state == "dead-lettered" and letter in found.places[0].detail
    [(_, new_id)] = replay("jobs", "a", ids=[letter]).replayed
    [found] = client.get(f"{GROUPS}find/", {"stream": "jobs", "q": second}).context["results"]
    assert (found.places[0].state, found.places[0].detail) == ("replayed", f"as entry {new_id}")

    # By message key: the newest entries carrying it.
    [found] = client.get(f"{GROUPS}find/", {"stream": "jobs", "q": "order-3"}).context["results"]
    assert found.entry_id == third and [p.state for p in found.places] == ["handled", "not yet delivered",
                                                                            "not yet delivered"]


def test_the_group_and_pending_pages_refresh_themselves_only_when_asked(staff_client, redis):
    pending(redis, "jobs", "a", [{"n": 1}])
    client = staff_client()
    client.get(GROUPS)
    pk = ConsumerGroup.objects.get(name="a").pk
    for url in (f"{GROUPS}{pk}/change/", f"{GROUPS}{pk}/pending/"):
        quiet = client.get(url).content.decode()
        assert 'http-equiv="refresh"' not in quiet and "Shown at " in quiet and "?refresh=5" in quiet
        live = client.get(url, {"refresh": "5"}).content.decode()
        assert '<meta http-equiv="refresh" content="5">' in live and "Refreshing every 5 s" in live
        assert 'http-equiv="refresh"' not in client.get(url, {"refresh": "1"}).content.decode()  # below 5 s: off


def test_the_audit_trail_lists_shoals_log_entries_and_keeps_a_replayed_letters_history(staff_client, redis):
    [entry] = dead_letter(redis, [{"n": 1}])
    mirror.sync_all()
    pk = DeadLetter.objects.get(entry_id=entry).pk
    client = staff_client("streams_app.replay_deadletter", "admin.view_logentry")
    client.post("/admin/streams_app/deadletter/", {"_selected_action": str(pk), "index": "0",
                                                    "action": "replay_selected", "post": "yes"})
    assert not DeadLetter.objects.filter(pk=pk).exists()
    history = client.get(f"/admin/streams_app/deadletter/{pk}/history/", follow=True)
    assert history.status_code == 200
    [log] = history.context["cl"].result_list
    assert "Replayed to group a of jobs as entry" in log.change_message
    assert client.get("/admin/admin/logentry/", {"q": "Replayed"}).context["cl"].result_count == 1
    assert client.get(f"/admin/admin/logentry/{log.pk}/change/").status_code == 200
    assert client.post(f"/admin/admin/logentry/{log.pk}/delete/").status_code == 403
    assert staff_client().get("/admin/admin/logentry/").status_code == 403  # needs admin.view_logentry
