"""What a second on-call operator's trial of the control room found (issue 33, trial b): keys of
another type, the dead letter's own buttons, a resubmitted task retry."""
from html.parser import HTMLParser

import pytest

from streams_app.redis import keys
from streams_app.consuming.groups import ensure_group
from streams_app.models import ConsumerGroup, DeadLetter
from tests.streams_app.admin.fixtures import dead_letter, pending, staff_client  # noqa: F401

pytestmark = pytest.mark.django_db

GROUPS = "/admin/streams_app/consumergroup/"
LETTERS = "/admin/streams_app/deadletter/"


def messages_of(response):
    return [str(m) for m in response.context["messages"]]


# -- F4: an auxiliary key of another type -------------------------------------------------------

@pytest.mark.both_redis
def test_a_liveness_key_of_another_type_is_named_on_the_group_and_pending_pages_not_a_500(staff_client, redis):
    ids = pending(redis, "jobs", "a", [{"n": 1}])
    redis.set(keys.liveness_key("jobs"), "x")
    client = staff_client()
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    for url in (f"{GROUPS}{group.pk}/change/", f"{GROUPS}{group.pk}/pending/"):
        response = client.get(url)
        assert response.status_code == 200, url
        assert any(f"Redis key '{keys.liveness_key('jobs')}' holds a string, not a hash" in m
                   for m in messages_of(response)), messages_of(response)
    assert [e["id"] for e in client.get(f"{GROUPS}{group.pk}/pending/").context["entries"]] == ids
    assert redis.get(keys.liveness_key("jobs")) == "x"  # left as it is


@pytest.mark.both_redis
def test_an_error_record_of_another_type_is_named_on_its_entry_and_the_others_are_listed(staff_client, redis):
    ids = pending(redis, "jobs", "a", [{"n": 1}, {"n": 2}])
    bad = keys.error_key("jobs", "a", ids[0])
    redis.set(bad, "x")
    redis.hset(keys.error_key("jobs", "a", ids[1]), mapping={"error": "ValueError: nope", "at": "1"})
    client = staff_client()
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    response = client.get(f"{GROUPS}{group.pk}/pending/")
    assert response.status_code == 200
    first, second = response.context["entries"]
    assert [first["id"], second["id"]] == ids
    assert f"Redis key '{bad}' holds a string, not a hash" in first["error"]
    assert second["error"] == "ValueError: nope"
    assert redis.get(bad) == "x"


@pytest.mark.both_redis
def test_an_entry_whose_error_record_has_another_type_can_still_be_moved_to_the_dead_letters(staff_client, redis):
    [entry] = pending(redis, "jobs", "a", [{"n": 1}])
    redis.set(keys.error_key("jobs", "a", entry), "x")
    client = staff_client("streams_app.deadletter_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    done = client.post(f"{GROUPS}{group.pk}/pending/", {"action": "deadletter", "entry": [entry], "post": "yes"})
    assert done.status_code == 302
    [(_, fields)] = redis.xrange(keys.dead_letter_key("jobs"))
    assert fields["shoal:origin_id"] == entry and "moved to the dead letters by" in fields["shoal:error"]
    assert redis.xpending("jobs", "a")["pending"] == 0


@pytest.mark.both_redis
def test_the_reclaimers_move_of_an_entry_whose_error_record_has_another_type_goes_through(redis):
    from streams_app.deadletters import store as deadletters

    [entry] = pending(redis, "jobs", "a", [{"n": 1}])
    redis.set(keys.error_key("jobs", "a", entry), "x")
    result = deadletters.move(redis, "jobs", "a", [(entry, deadletters.RECORDED_ERROR, "")])
    assert [i for i, _ in result.moved] == [entry] and not result.refused
    [(_, fields)] = redis.xrange(keys.dead_letter_key("jobs"))
    assert "no handler error recorded" in fields["shoal:error"]


@pytest.mark.both_redis
def test_find_a_message_names_an_error_record_of_another_type(staff_client, redis):
    [entry] = pending(redis, "jobs", "a", [{"n": 1}])
    bad = keys.error_key("jobs", "a", entry)
    redis.set(bad, "x")
    client = staff_client()
    client.get(GROUPS)
    response = client.get(f"{GROUPS}find/", {"stream": "jobs", "q": entry})
    assert response.status_code == 200
    assert f"Redis key &#x27;{bad}&#x27; holds a string, not a hash" in response.content.decode()


# -- F3: the dead letter's own Replay / Delete buttons ------------------------------------------

class Forms(HTMLParser):
    """Each <form> with its action, the forms it was opened inside, and the submit buttons it holds
    as a browser assigns them (a button belongs to the innermost open form)."""

    def __init__(self):
        super().__init__()
        self.open, self.forms = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            form = {"action": attrs.get("action"), "inside": [f["action"] for f in self.open], "buttons": {},
                    "fields": {}}
            self.forms.append(form)
            self.open.append(form)
        elif tag == "button" and self.open:
            self.open[-1]["buttons"][attrs.get("value")] = attrs.get("name")
        elif tag == "input" and self.open and attrs.get("type") == "hidden":
            self.open[-1]["fields"][attrs.get("name")] = attrs.get("value")

    def handle_endtag(self, tag):
        if tag == "form" and self.open:
            self.open.pop()


def test_a_dead_letters_replay_and_delete_buttons_are_in_a_form_of_their_own_posting_to_the_list(staff_client, redis):
    dead_letter(redis, [{"n": 1}])
    client = staff_client("streams_app.replay_deadletter", "streams_app.delete_deadletter")
    client.get(LETTERS)
    letter = DeadLetter.objects.get()
    parser = Forms()
    parser.feed(client.get(f"{LETTERS}{letter.pk}/change/").content.decode())
    assert [f for f in parser.forms if f["inside"]] == []  # browsers drop a nested form's tag
    [actions] = [f for f in parser.forms if "replay_selected" in f["buttons"]]
    assert actions["action"] == LETTERS
    assert set(actions["buttons"]) == {"replay_selected", "delete_selected_dead_letters"}
    for value in actions["buttons"]:  # what the click sends reaches the confirmation, not a 403
        confirm = client.post(actions["action"], {**actions["fields"], "action": value})
        assert confirm.status_code == 200 and b"Are you sure?" in confirm.content, value
    assert redis.xlen(keys.dead_letter_key("jobs")) == 1


# -- F2: a consumer name that is not UTF-8 -------------------------------------------------------

@pytest.mark.both_redis
@pytest.mark.parametrize("action", ["claim", "retry"])
def test_an_owner_whose_name_is_not_utf8_is_filtered_and_claimed_as_the_real_consumer(staff_client, redis_server,
                                                                                      redis, action):
    raw = redis_server.client(decode_responses=False)  # bytes in, bytes out
    ids = pending(redis, "jobs", "a", [{"n": 1}], consumer="c1")
    ids += pending(redis, "jobs", "a", [{"n": 2}])
    raw.xclaim("jobs", "a", b"\xff\xfebad", 0, [ids[1]])
    client = staff_client("streams_app.claim_pending", "streams_app.retry_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    url = f"{GROUPS}{group.pk}/pending/"
    shown = "\\xff\\xfebad"
    assert [e["id"] for e in client.get(url, {"consumer": "=" + shown}).context["entries"]] == ids[1:]
    if action == "claim":  # c1's entry to the consumer shown escaped: the real one, no new consumer
        posted = {"action": "claim", "entry": [ids[0]], "consumer": "=" + shown, "post": "yes"}
    else:  # made due at once, staying with its real owner
        posted = {"action": "retry", "entry": [ids[1]], "post": "yes"}
    assert client.post(url, posted).status_code == 302
    owners = {row["consumer"] for row in raw.xpending_range("jobs", "a", "-", "+", 10)}
    assert owners == ({b"\xff\xfebad"} if action == "claim" else {b"c1", b"\xff\xfebad"})
    assert {c["name"] for c in raw.xinfo_consumers("jobs", "a")} == {b"c1", b"\xff\xfebad"}


# -- F5: a refused claim says what is wrong -------------------------------------------------------

@pytest.mark.both_redis
def test_a_refused_claim_names_a_missing_consumer_or_a_vanished_group_not_a_dead_one(staff_client, redis):
    [entry] = pending(redis, "jobs", "a", [{"n": 1}])
    client = staff_client("streams_app.claim_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    url = f"{GROUPS}{group.pk}/pending/"

    def refusal(consumer):
        said = messages_of(client.post(url, {"action": "claim", "entry": [entry], "consumer": consumer,
                                             "post": "yes"}, follow=True))
        assert not any("not dead" in m for m in said), said
        return said

    said = refusal("nobody-here")
    assert any("jobs:a has no consumer named 'nobody-here'" in m and "Nothing was claimed" in m for m in said), said
    redis.delete("jobs")
    said = refusal("=c1")
    assert any(m == "Group jobs:a no longer exists in Redis. Nothing was claimed." for m in said), said


# -- F6: wording -----------------------------------------------------------------------------------

def test_one_dead_letter_gone_meanwhile_is_said_in_the_singular(staff_client, redis):
    from streams_app.admin import mirror

    [gone] = dead_letter(redis, [{"n": 1}])
    mirror.sync_all()
    pk = DeadLetter.objects.get(entry_id=gone).pk
    client = staff_client("streams_app.replay_deadletter", "streams_app.delete_deadletter")
    selected = {"_selected_action": [str(pk)], "post": "yes"}
    client.post(LETTERS, {"action": "replay_selected", **selected})  # another admin, after this page was rendered
    response = client.post(LETTERS, {"action": "delete_selected_dead_letters", **selected}, follow=True)
    said = messages_of(response)
    assert any(m.startswith("1 of the selected dead letters is gone:") for m in said), said


@pytest.mark.parametrize("error", ["Error 111 connecting to 127.0.0.1:1. Connection refused.", "TimeoutError: x"])
def test_the_mirror_age_note_ends_an_error_with_one_period(error):
    from types import SimpleNamespace

    from django.template.loader import render_to_string

    html = render_to_string("admin/shoal/mirror_age.html", {"mirror": SimpleNamespace(error=error, synced_at=None)})
    assert ".." not in html and f"did not complete: {error.rstrip('.')}." in html


@pytest.mark.both_redis
def test_an_owner_named_with_a_nul_is_shown_and_sent_as_backslash_x00_and_still_found(staff_client, redis_server,
                                                                                      redis):
    raw = redis_server.client(decode_responses=False)
    ids = pending(redis, "jobs", "a", [{"n": 1}, {"n": 2}], consumer="c1")
    raw.xclaim("jobs", "a", b"bad\x00name", 0, [ids[1]])
    client = staff_client("streams_app.claim_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    url = f"{GROUPS}{group.pk}/pending/"
    html = client.get(url).content.decode()
    assert "\x00" not in html and 'value="=bad\\x00name"' in html
    assert [e["id"] for e in client.get(url, {"consumer": "=bad\\x00name"}).context["entries"]] == ids[1:]
    posted = {"action": "claim", "entry": [ids[0]], "consumer": "=bad\\x00name", "post": "yes"}
    assert client.post(url, posted).status_code == 302
    assert {row["consumer"] for row in raw.xpending_range("jobs", "a", "-", "+", 10)} == {b"bad\x00name"}


@pytest.mark.both_redis
def test_a_pending_row_of_the_consumer_named_empty_says_so(staff_client, redis):
    pending(redis, "jobs", "a", [{"n": 1}], consumer="")
    client = staff_client()
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    html = client.get(f"{GROUPS}{group.pk}/pending/").content.decode()
    row = html[html.index("<tbody"):]
    assert '<td>(empty name) <span class="shoal-' in row, row[:600]


# -- issue 33, what the last round left: a group or a live reader whose name is not UTF-8 -----------

def test_a_group_whose_name_is_not_utf8_lists_its_pending_entries_and_acts_on_the_real_group(staff_client,
                                                                                          redis_server, redis):
    raw = redis_server.client(decode_responses=False)
    raw.xgroup_create("jobs", b"\xffgrp", id="$", mkstream=True)
    ids = [redis.xadd("jobs", {"payload": f'{{"n": {n}}}'}) for n in range(3)]
    raw.xreadgroup(b"\xffgrp", b"c1", {"jobs": ">"})
    client = staff_client("streams_app.claim_pending", "streams_app.ack_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="\\xffgrp")  # shown escaped, as consumer names are
    assert group.pending == 3
    url = f"{GROUPS}{group.pk}/pending/"
    response = client.get(url)
    assert not any("no longer exists" in m for m in messages_of(response)), messages_of(response)
    assert response.context["total"] == 3 and [e["id"] for e in response.context["entries"]] == ids
    assert [c.name for c in response.context["consumers"]] == ["c1"]
    assert [c.name for c in client.get(f"{GROUPS}{group.pk}/change/").context["consumers"]] == ["c1"]
    raw.xgroup_createconsumer("jobs", b"\xffgrp", b"c2")  # a second consumer to claim to
    claimed = client.post(url, {"action": "claim", "entry": [ids[0]], "consumer": "=c2", "post": "yes"}, follow=True)
    assert any(m.startswith("Claimed 1 pending entry") for m in messages_of(claimed)), messages_of(claimed)
    assert client.post(url, {"action": "ack", "entry": [ids[1]], "post": "yes"}).status_code == 302
    owners = {r["message_id"].decode(): r["consumer"] for r in raw.xpending_range("jobs", b"\xffgrp", "-", "+", 10)}
    assert owners == {ids[0]: b"c2", ids[2]: b"c1"}
    assert {g["name"] for g in raw.xinfo_groups("jobs")} == {b"\xffgrp"}  # no group made under the escaped name
    group.refresh_from_db()
    assert group.pending == 2 and group.live_consumers == 0  # the mirror reads the real group too


def test_a_live_reader_whose_name_is_not_utf8_and_not_in_the_group_is_claimed_to_under_its_real_name(
        staff_client, redis_server, redis):
    raw = redis_server.client(decode_responses=False)
    [entry] = pending(redis, "jobs", "a", [{"n": 1}])
    now_ms = int(redis.time()[0]) * 1000
    raw.hset(keys.liveness_key("jobs"), b"\xfereader", now_ms + 600_000)  # alive, has read nothing in "a" yet
    client = staff_client("streams_app.claim_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name="a")
    url = f"{GROUPS}{group.pk}/pending/"
    targets = [value for value, _, _ in client.get(url).context["claim_targets"]]
    assert "=\\xfereader" in targets
    posted = {"action": "claim", "entry": [entry], "consumer": "=\\xfereader", "post": "yes"}
    assert client.post(url, posted).status_code == 302
    assert {c["name"] for c in raw.xinfo_consumers("jobs", "a")} == {b"c1", b"\xfereader"}  # no phantom
    assert [r["consumer"] for r in raw.xpending_range("jobs", "a", "-", "+", 10)] == [b"\xfereader"]


def test_find_an_id_past_the_streams_last_entry_says_no_such_entry_yet_not_not_yet_delivered(staff_client, redis):
    ensure_group(redis, "jobs", "b", start="$")  # reads nothing
    [entry] = pending(redis, "jobs", "a", [{"n": 1}])
    client = staff_client()
    client.get(GROUPS)
    beyond = f"{int(entry.split('-')[0]) + 60_000}-0"
    [found] = client.get(f"{GROUPS}find/", {"stream": "jobs", "q": beyond}).context["results"]
    assert {p.group: p.state for p in found.places} == {"a": "not published", "b": "not published"}
    assert all(f"beyond the stream's last entry {entry}" in p.detail for p in found.places), found.places
    [found] = client.get(f"{GROUPS}find/", {"stream": "jobs", "q": entry}).context["results"]
    assert {p.group: p.state for p in found.places} == {"a": "pending", "b": "not yet delivered"}


# -- F8: a group-wide replay job is audited per letter, as README and docs/admin.md say -------------

def test_a_replay_job_writes_one_log_entry_per_replayed_dead_letter_by_whoever_queued_it(staff_client, redis):
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType

    from streams_app.redis.connection import get_connection
    from streams_app.deadletters import jobs

    letters = dead_letter(redis, [{"n": n} for n in range(450)], group="a")
    dead_letter(redis, [{"n": 1}], group="b")
    client = staff_client("streams_app.replay_deadletter")
    client.get(GROUPS)
    mirrored = dict(DeadLetter.objects.filter(group="a").values_list("entry_id", "pk"))
    group = ConsumerGroup.objects.get(name="a")
    client.post(f"{GROUPS}{group.pk}/replay-dead-letters/", {"action": "replay_all", "post": "yes"})
    job = jobs.run_next(get_connection())
    assert job.replayed == 450
    kind = ContentType.objects.get_for_model(DeadLetter, for_concrete_model=False)
    audit = LogEntry.objects.filter(content_type=kind, change_message__contains=f"(replay job {job.pk})")
    assert audit.count() == 450 and {e.user.username for e in audit} == {"staff0"}
    assert {e.action_flag for e in audit} == {CHANGE}
    assert sorted(e.object_repr for e in audit) == sorted(f"jobs {i}" for i in letters)
    assert {e.object_id for e in audit} == {str(mirrored[i]) for i in letters}  # each letter's History finds it


def test_every_page_about_a_group_names_it_as_the_readmes_tour_does_never_capitalised(staff_client, redis):
    # An operator's trial read "Orders:email" somewhere; the tour says stream `orders`, page `orders:email`.
    dead_letter(redis, [{"n": 1}], stream="orders", group="email")
    [entry] = pending(redis, "orders", "email", [{"n": 2}])
    client = staff_client("streams_app.replay_deadletter", "streams_app.retry_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get()
    pages = {
        "group": client.get(f"{GROUPS}{group.pk}/change/"),
        "pending": client.get(f"{GROUPS}{group.pk}/pending/"),
        "confirmation": client.post(f"{GROUPS}{group.pk}/pending/", {"action": "retry", "entry": [entry]}),
        "replay all": client.get(f"{GROUPS}{group.pk}/replay-dead-letters/"),
        "history": client.get(f"{GROUPS}{group.pk}/history/"),
        "replay job": client.post(f"{GROUPS}{group.pk}/replay-dead-letters/", {"post": "yes"}, follow=True),
        "index": client.get("/admin/"),
    }
    for what, response in pages.items():
        html = response.content.decode()
        assert response.status_code == 200 and "orders:email" in html, what
        assert "Orders" not in html and "Email" not in html, what
