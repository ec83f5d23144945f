"""What an on-call operator's trial of the control room found (issue 33): the admin through Django's test
client, and the replay command it sends operators to."""
import pytest

from streams_app import publish_many
from streams_app.redis import keys
from streams_app.consuming.groups import ensure_group
from streams_app.models import ConsumerGroup, DeadLetter, Stream
from tests.streams_app.admin.fixtures import dead_letter, pending, staff_client  # noqa: F401

pytestmark = pytest.mark.django_db

GROUPS = "/admin/streams_app/consumergroup/"
LETTERS = "/admin/streams_app/deadletter/"


def messages_of(response):
    return [str(m) for m in response.context["messages"]]


@pytest.fixture
def hung_redis(redis_factory, use_redis, settings, monkeypatch):
    """A private Redis the admin asks with a 0.5 s timeout, and ``freeze_before(owner, name, call)``:
    Redis is stopped (SIGSTOP, waited for) just before the ``call``-th call of ``owner.name``, whose
    command is then sent to a Redis that does not answer; continued by ``thaw()`` or at teardown."""
    import os
    import signal
    from types import SimpleNamespace

    settings.STREAMS = {"ADMIN_REDIS_TIMEOUT": 0.5}
    server = redis_factory()
    use_redis(server)
    frozen = []

    def thaw():
        if frozen:
            server.process.send_signal(signal.SIGCONT)
            frozen.clear()

    def freeze_before(owner, name, call=1, when=lambda *args, **kwargs: True):
        real, calls = getattr(owner, name), []

        def wrapper(*args, **kwargs):
            if when(*args, **kwargs):
                calls.append(1)
                if len(calls) == call:
                    server.process.send_signal(signal.SIGSTOP)
                    os.waitpid(server.process.pid, os.WUNTRACED)  # stopped now, not in a moment
                    frozen.append(True)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)
        return calls

    yield SimpleNamespace(server=server, conn=server.client(), freeze_before=freeze_before, thaw=thaw)
    thaw()


# -- item 2: Find a message on keys of another type -------------------------------------------------

@pytest.mark.both_redis
def test_find_a_message_names_a_stream_or_dead_letter_key_of_another_type_instead_of_a_500(staff_client, redis):
    ensure_group(redis, "jobs", "a", start="$")
    [entry] = publish_many("jobs", [{"n": 1}])
    redis.set(keys.dead_letter_key("jobs"), "not a stream")
    redis.set("notes", "precious")
    client = staff_client()
    page = client.get(f"{GROUPS}find/", {"stream": "jobs", "q": entry})
    assert page.status_code == 200
    [found] = page.context["results"]
    assert [(p.group, p.state) for p in found.places] == [("a", "not yet delivered")]  # the rest is still shown
    assert found.problem == "Redis key '{jobs}:dlq' holds a string, not a stream: its dead letters cannot be looked for."
    assert "holds a string, not a stream: its dead letters cannot be looked for." in page.content.decode()

    page = client.get(f"{GROUPS}find/", {"stream": "notes", "q": "1-0"})
    assert page.status_code == 200 and page.context["results"] == []
    assert page.context["problem"] == "Redis key 'notes' holds a string, not a stream; Shoal leaves it as it is."
    assert client.get(f"{GROUPS}find/", {"stream": "notes", "q": "order-7"}).context["problem"].startswith(
        "Redis key 'notes' holds a string")
    assert redis.get("notes") == "precious" and redis.get(keys.dead_letter_key("jobs")) == "not a stream"


# -- item 3: a dead-letter key that is gone ---------------------------------------------------------

@pytest.mark.both_redis
@pytest.mark.parametrize("loss", ["deleted", "another type"])
def test_dead_letters_whose_key_left_redis_leave_every_page_and_count(staff_client, redis, loss):
    from streams_app.conf import get_settings
    from streams_app.redis.connection import get_connection
    from streams_app.operations.reclaim import Reclaimer
    from streams_app.registry import select

    dead_letter(redis, [{"n": 1}, {"n": 2}], group="a")
    client = staff_client()
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    assert (group.dead_letters, DeadLetter.objects.count()) == (2, 2)
    # A Redis restarted without persistence, FLUSHALL, DEL {jobs}:dlq (or a key of another type there).
    redis.delete(keys.dead_letter_key("jobs"))
    if loss == "another type":
        redis.set(keys.dead_letter_key("jobs"), "x")
    listed = client.get(GROUPS)
    assert {g.name: g.dead_letters for g in listed.context["cl"].result_list} == {"a": 0}
    assert client.get(LETTERS).context["cl"].result_count == 0
    assert client.get(f"{GROUPS}{group.pk}/change/").context["original"].dead_letters == 0
    assert Stream.objects.get(name="jobs").dead_letters == 0
    # The reclaim daemon's pass agrees, and a letter that comes afterwards is copied as usual.
    redis.delete(keys.dead_letter_key("jobs"))
    [later] = dead_letter(redis, [{"n": 3}], group="a")
    Reclaimer(select(["jobs:a"]), conn=get_connection(), config=get_settings()).tick()
    assert list(DeadLetter.objects.values_list("entry_id", flat=True)) == [later]
    assert ConsumerGroup.objects.get(name="a").dead_letters == 1


# -- item 4: a dead letter too wide to replay from a script ----------------------------------------

def wide_dead_letter(redis, stream="jobs", group="a"):
    """An entry of 3,600 fields (a foreign producer's), failed and dead-lettered: its fields are packed
    into shoal:fields, which the replay script cannot unpack into one XADD."""
    from streams_app.deadletters import store as deadletters

    ensure_group(redis, stream, group, start="$")
    entry = redis.xadd(stream, {"payload": '{"n": "wide"}', **{f"f{i}": "v" for i in range(3600)}})
    redis.xreadgroup(group, "c1", {stream: ">"})
    [letter] = deadletters.move(redis, stream, group, [(entry, "ValueError: too wide", "")]).dead_letter_ids
    assert redis.xrange(keys.dead_letter_key(stream), letter, letter)[0][1].get("shoal:fields")
    return letter


@pytest.mark.both_redis
def test_replaying_a_too_wide_dead_letter_says_why_it_cannot_and_keeps_it_listed(staff_client, redis):
    from django.core.management import call_command

    wide = wide_dead_letter(redis)
    [plain] = dead_letter(redis, [{"n": 1}])
    client = staff_client("streams_app.replay_deadletter")
    client.get(LETTERS)
    pks = {d.entry_id: d.pk for d in DeadLetter.objects.all()}
    done = client.post(LETTERS, {"action": "replay_selected", "_selected_action": [pks[wide], pks[plain]], "index": "0",
                                 "post": "yes"}, follow=True)
    shown = messages_of(done)
    assert "Replayed 1 dead letter." in shown, shown
    assert any(f"1 dead letter was not replayed: {wide}" in m and "too many fields" in m and "XADD" in m
               for m in shown), shown
    assert not any("no longer in Redis" in m for m in shown), shown
    assert [i for i, _ in redis.xrange(keys.dead_letter_key("jobs"))] == [wide]
    # Still listed, searchable, its page answers.
    assert list(DeadLetter.objects.values_list("entry_id", flat=True)) == [wide]
    assert client.get(LETTERS, {"q": wide}).context["cl"].result_count == 1
    assert client.get(f"{LETTERS}{pks[wide]}/change/").status_code == 200

    # The edited replay says so too, and keeps it.
    edited = client.post(f"{LETTERS}{pks[wide]}/replay/", {"payload": '{"n": 2}', "payload_types": "", "post": "yes"},
                         follow=True)
    assert any("too many fields" in m for m in messages_of(edited)), messages_of(edited)
    assert DeadLetter.objects.filter(entry_id=wide).exists() and redis.xlen(keys.dead_letter_key("jobs")) == 1

    # The CLI's dry run does not count it as replayable.
    import io

    out, err = io.StringIO(), io.StringIO()
    call_command("replay", "jobs", "--group", "a", "--all", "--dry-run", stdout=out, stderr=err)
    assert "Would replay 0 dead letters of jobs for group a" in out.getvalue()
    assert f"{wide}: skipped, too many fields" in err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(Exception, match="none of the given ids could be replayed"):
        call_command("replay", "jobs", "--group", "a", "--id", wide, "--dry-run", stdout=out, stderr=err)
    assert f"{wide}: skipped, too many fields" in err.getvalue()


# -- item 5: a bulk replay cut short: the batch in flight is in doubt --------------------------------

def test_a_bulk_replay_cut_short_by_a_hung_redis_counts_the_batch_in_flight_as_in_doubt(staff_client, hung_redis):
    from streams_app.redis import scripts
    from streams_app.admin import mirror
    from tests.waiting import wait_for

    conn = hung_redis.conn
    dead_letter(conn, [{"n": n} for n in range(600)])  # three batches of ACTION_BATCH (200)
    mirror.sync_all()
    # Redis freezes as the second batch's script is sent: the admin gives up after its 0.5 s, and
    # Redis, continued, runs what was sent all the same.
    calls = hung_redis.freeze_before(scripts, "run", call=2, when=lambda client, name, *args, **kwargs: name == "replay")
    client = staff_client("streams_app.replay_deadletter")
    pks = list(DeadLetter.objects.values_list("pk", flat=True))
    done = client.post(LETTERS, {"action": "replay_selected", "_selected_action": [str(pks[0])], "select_across": "1",
                                 "index": "0", "post": "yes"}, follow=True)
    hung_redis.thaw()
    shown = messages_of(done)
    assert len(calls) == 2
    # What Redis did: the first batch and the one in flight both ran.
    wait_for(lambda: conn.xlen(keys.dead_letter_key("jobs")) == 200, timeout=10, what="the batch in flight run")
    [message] = [m for m in shown if "before Redis failed" in m]
    assert "Replayed 200 dead letters before Redis failed (TimeoutError" in message, message
    assert "the next 200 may or may not have been replayed" in message, message
    assert "the other 200 were not replayed" in message, message
    # Once Redis answers, the list shows what is still a dead letter.
    client.get(LETTERS)
    assert DeadLetter.objects.count() == 200


# -- item 6: a replay job taken over keeps its counts ------------------------------------------------

class Killed(BaseException):
    """The runner's death (SIGKILL): nothing after it runs in that process, no except clause sees it."""


@pytest.mark.both_redis
def test_a_replay_job_taken_over_after_its_runner_died_keeps_every_count(staff_client, redis, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from streams_app.redis import scripts
    from streams_app.redis.connection import get_connection
    from streams_app.deadletters import jobs
    from streams_app.models import ReplayJob

    dead_letter(redis, [{"n": n} for n in range(1000)], group="a")
    dead_letter(redis, [{"n": n} for n in range(5)], group="b")
    job = jobs.queue("jobs", "a")
    real, calls = scripts.run, []

    def die_after_the_third_batch(client, name, *args, **kwargs):
        reply = real(client, name, *args, **kwargs)
        if name == "replay":
            calls.append(1)
            if len(calls) == 3:
                raise Killed  # the batch ran in Redis; its runner died before recording it
        return reply

    monkeypatch.setattr(scripts, "run", die_after_the_third_batch)
    with pytest.raises(Killed):
        jobs.run_next(get_connection())
    monkeypatch.setattr(scripts, "run", real)
    assert redis.xlen(keys.dead_letter_key("jobs")) == 1005 - 600
    job.refresh_from_db()
    assert job.state == ReplayJob.RUNNING
    # Two minutes without a heartbeat: the next pass takes it over.
    ReplayJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - jobs.STALE_AFTER - timedelta(seconds=1))
    assert jobs.run_next(get_connection()).pk == job.pk
    job.refresh_from_db()
    assert (job.state, job.replayed, job.skipped) == (ReplayJob.DONE, 1000, 0)
    assert (job.scanned, job.total) == (1005, 1005)  # looked at once each, as the first run began counting
    assert redis.xlen(keys.dead_letter_key("jobs")) == 5  # group b's
    replayed = [f for _, f in redis.xrange("jobs") if f.get("shoal:target_group") == "a"]
    assert len(replayed) == 1000 and len({f["shoal:replay_of"] for f in replayed}) == 1000  # none twice
    page = staff_client("streams_app.replay_deadletter").get(f"/admin/streams_app/replayjob/{job.pk}/change/")
    assert "1005 of 1005 dead letters looked at (100%)" in page.content.decode()


# -- item 9 (the audit trail too): an action nobody may run is a 403, not a list shown again -----------

def test_posting_delete_selected_on_the_audit_trail_is_403_and_keeps_the_entries(staff_client, redis):
    from django.contrib.admin.models import LogEntry

    dead_letter(redis, [{"n": 1}])
    client = staff_client("streams_app.replay_deadletter", "admin.view_logentry")
    client.get(LETTERS)
    client.post(LETTERS, {"_selected_action": [DeadLetter.objects.get().pk], "index": "0", "action": "replay_selected",
                          "post": "yes"})
    [log] = LogEntry.objects.all()
    for step in ({"index": "0"}, {"post": "yes"}):
        answer = client.post("/admin/admin/logentry/", {"action": "delete_selected", "_selected_action": [log.pk], **step})
        assert answer.status_code == 403
    assert LogEntry.objects.count() == 1


# -- item 10: pending in all partitions during an outage ----------------------------------------------

@pytest.mark.parametrize("outage", ["down", "frozen"])
def test_pending_in_all_partitions_shows_the_last_copy_when_redis_is_away(staff_client, redis_factory, use_redis,
                                                                           settings, outage):
    import signal

    from streams_app.partitioning import partitions
    from streams_app.admin import mirror

    settings.STREAMS = {"PARTITIONS": {"orders": 3}, "ADMIN_REDIS_TIMEOUT": 0.5}
    server = redis_factory()
    use_redis(server)
    conn = server.client()
    for name in partitions.names("orders"):
        ensure_group(conn, name, "p", start="0")
    publish_many("orders", [{"n": n} for n in range(30)], keys=[f"customer-{n}" for n in range(30)])
    for name in partitions.names("orders"):
        conn.xreadgroup("p", "c1", {name: ">"}, count=5)
    mirror.sync_all()
    client = staff_client()
    url = f"{GROUPS}logical-pending/?stream=orders&group=p"
    assert "15 entries pending in group p" in client.get(url).content.decode()
    if outage == "down":
        server.stop()
    else:
        server.process.send_signal(signal.SIGSTOP)
    try:
        page = client.get(url)
    finally:
        if outage == "frozen":
            server.process.send_signal(signal.SIGCONT)
    assert page.status_code == 200  # not a redirect to .../consumergroup/change/, a 404
    html = page.content.decode()
    assert "15 entries pending in group p" in html  # the mirror's counts, with their age
    assert "Redis is unreachable" in html and "The last copy from Redis did not complete" in html
    assert [p["pending"] for p in page.context["partitions"]] == [5, 5, 5]
    assert page.context["entries"] == []


@pytest.mark.parametrize("path, back", [
    ("/admin/streams_app/consumergroup/7/pending/", "/admin/streams_app/consumergroup/7/change/"),
    ("/admin/streams_app/consumergroup/logical-pending/", "/admin/streams_app/consumergroup/"),
    ("/admin/streams_app/stream/logical/", "/admin/streams_app/stream/"),
])
def test_a_page_that_meets_an_outage_sends_back_to_a_page_that_exists(path, back):
    import redis as redis_lib
    from django.contrib.messages.storage.cookie import CookieStorage
    from django.test import RequestFactory

    from shoal_common.admin import redis_unreachable_is_a_message

    @redis_unreachable_is_a_message
    def view(model_admin, request):
        raise redis_lib.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    request = RequestFactory().get(path + "?stream=orders&group=p")
    request._messages = CookieStorage(request)
    response = view(None, request)
    assert (response.status_code, response["Location"]) == (302, back)


# -- item 11: smaller findings -------------------------------------------------------------------------

def test_a_dry_run_replay_during_an_outage_does_not_say_it_stopped_part_way(redis_factory, use_redis):
    from django.core.management import CommandError, call_command

    server = redis_factory()
    use_redis(server)
    dead_letter(server.client(), [{"n": 1}])
    server.stop()
    with pytest.raises(CommandError) as raised:
        call_command("replay", "jobs", "--group", "a", "--all", "--dry-run")
    assert "nothing was replayed (a dry run replays nothing)" in str(raised.value), str(raised.value)
    assert "part-way" not in str(raised.value)
    with pytest.raises(CommandError, match="the replay stopped part-way"):
        call_command("replay", "jobs", "--group", "a", "--all")


@pytest.mark.both_redis
def test_find_a_message_tells_an_id_the_stream_never_had_from_one_that_left_it(staff_client, redis):
    ensure_group(redis, "jobs", "a", start="$")
    first, second, third = publish_many("jobs", [{"n": 1}, {"n": 2}, {"n": 3}])
    redis.xdel("jobs", second)
    client = staff_client()

    def title(entry_id):
        [found] = client.get(f"{GROUPS}find/", {"stream": "jobs", "q": entry_id}).context["results"]
        return found.absence

    ms, seq = (int(part) for part in third.split("-"))
    assert title(f"{ms + 60_000}-0") == f"not in the stream: past its last entry id {third}"
    assert title(f"{ms}-{seq + 1}") == f"not in the stream: past its last entry id {third}"
    assert title(second) == "not in the stream: deleted or trimmed, or never there"
    assert title(first) == ""
    html = client.get(f"{GROUPS}find/", {"stream": "jobs", "q": f"{ms + 60_000}-0"}).content.decode()
    assert f"(not in the stream: past its last entry id {third})" in html and "deleted or trimmed" not in html


@pytest.mark.both_redis
def test_a_consumer_named_empty_is_offered_as_owner_and_claim_target_apart_from_the_placeholder(staff_client, redis):
    import re

    ids = pending(redis, "jobs", "a", [{"n": 1}, {"n": 2}], consumer="")
    ids += pending(redis, "jobs", "a", [{"n": 3}], consumer="c2")
    client = staff_client("streams_app.claim_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    url = f"{GROUPS}{group.pk}/pending/"
    html = client.get(url).content.decode()
    owner = html[html.index('name="consumer"'):html.index("</select>", html.index('name="consumer"'))]
    claim = html[html.index('<label>Claim to consumer'):]
    claim = claim[:claim.index("</select>")]
    owner_values = re.findall(r'<option value="([^"]*)"', owner)
    claim_values = re.findall(r'<option value="([^"]*)"', claim)
    assert len(owner_values) == 3 and len(set(owner_values)) == 3, owner  # any, "", c2
    assert len(claim_values) == 3 and len(set(claim_values)) == 3, claim  # ---------, "", c2
    assert "(empty name)" in owner and "(empty name)" in claim
    [any_owner, empty, c2] = owner_values
    # Filtering by the empty-named owner shows its two entries, not every entry.
    listed = client.get(url, {"consumer": empty}).context["entries"]
    assert [e["id"] for e in listed] == ids[:2]
    assert [e["id"] for e in client.get(url, {"consumer": any_owner}).context["entries"]] == ids
    # The placeholder claims to nobody; the empty-named consumer can be chosen.
    placeholder = claim_values[0]
    refused = client.post(url, {"action": "claim", "entry": [ids[2]], "consumer": placeholder, "post": "yes"},
                          follow=True)
    assert any("Choose a consumer" in m for m in messages_of(refused)), messages_of(refused)
    assert redis.xpending_range("jobs", "a", ids[2], ids[2], 1)[0]["consumer"] == "c2"
    done = client.post(url, {"action": "claim", "entry": [ids[2]], "consumer": claim_values[1], "post": "yes"})
    assert done.status_code == 302
    assert redis.xpending_range("jobs", "a", ids[2], ids[2], 1)[0]["consumer"] == ""
    # A plain name still works, as links and scripts pass it.
    client.post(url, {"action": "claim", "entry": [ids[2]], "consumer": "c2", "post": "yes"})
    assert redis.xpending_range("jobs", "a", ids[2], ids[2], 1)[0]["consumer"] == "c2"
    assert [e["id"] for e in client.get(url, {"consumer": "c2"}).context["entries"]] == ids[2:]


# -- found on the way: a bulk pending action cut short said "Nothing was changed" and audited nothing ----

def test_a_bulk_pending_action_cut_short_by_a_hung_redis_reports_and_audits_what_it_did(staff_client, hung_redis):
    from django.contrib.admin.models import LogEntry

    from streams_app.admin import pending as pending_admin
    from tests.waiting import wait_for

    conn = hung_redis.conn
    ids = pending(conn, "jobs", "a", [{"n": n} for n in range(1200)])  # three batches of BULK_BATCH (500)
    client = staff_client("streams_app.ack_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    hung_redis.freeze_before(pending_admin, "_act", call=2)  # the second batch's XACK meets a frozen Redis
    done = client.post(f"{GROUPS}{group.pk}/pending/", {"action": "ack", "select_across": "1", "post": "yes"},
                       follow=True)
    hung_redis.thaw()
    shown = messages_of(done)
    assert not any("Nothing was changed" in m for m in shown), shown
    [message] = [m for m in shown if "before Redis failed" in m]
    assert message.startswith("Acknowledged 500 pending entries of jobs:a before Redis failed (TimeoutError"), message
    assert "the next 500 may or may not have been" in message, message
    # The batch that was done is audited, entry by entry.
    [log] = LogEntry.objects.all()
    assert log.change_message.startswith("Acknowledged 500 pending entries: ")
    assert set(log.change_message.split(": ", 1)[1].split(", ")) == set(ids[:500])
    wait_for(lambda: conn.xpending("jobs", "a")["pending"] == 200, timeout=10, what="the batch in flight acked")


def test_an_action_whose_command_redis_did_not_answer_does_not_claim_nothing_changed(staff_client, hung_redis,
                                                                                      monkeypatch):
    from streams_app.admin import pending as pending_admin
    from tests.waiting import wait_for

    conn = hung_redis.conn
    ids = pending(conn, "jobs", "a", [{"n": 1}, {"n": 2}])
    client = staff_client("streams_app.ack_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    real = pending_admin._act
    hung_redis.freeze_before(pending_admin, "_act")
    done = client.post(f"{GROUPS}{group.pk}/pending/", {"action": "ack", "entry": ids, "post": "yes"}, follow=True)
    hung_redis.thaw()
    shown = messages_of(done)
    assert not any("Nothing was changed" in m for m in shown), shown
    assert any("may or may not have been done" in m for m in shown), shown
    wait_for(lambda: conn.xpending("jobs", "a")["pending"] == 0, timeout=10, what="the XACK sent, then run")
    # A Redis that refuses the connection ran nothing: that one still says so.
    hung_redis.server.stop()
    monkeypatch.setattr(pending_admin, "_act", real)
    refused = client.post(f"{GROUPS}{group.pk}/pending/", {"action": "ack", "entry": ids, "post": "yes"}, follow=True)
    assert any("Nothing was changed" in m for m in messages_of(refused)), messages_of(refused)
