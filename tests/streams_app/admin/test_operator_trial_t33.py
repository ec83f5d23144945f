"""On-call trial t33 (issue 33): another client's group named in bytes that are not UTF-8, on a stream
Shoal's own groups read. Replays and Find a message go on for every group, that one included."""
import pytest
from django.core.management import call_command

from streams_app.redis import keys
from streams_app.models import ConsumerGroup, DeadLetter
from tests.streams_app.admin.fixtures import dead_letter, staff_client  # noqa: F401

pytestmark = pytest.mark.django_db

GROUPS = "/admin/streams_app/consumergroup/"
LETTERS = "/admin/streams_app/deadletter/"
BAD = b"grp\xff\xfe"
SHOWN = "grp\\xff\\xfe"


def messages_of(response):
    return [str(m) for m in response.context["messages"]]


@pytest.fixture
def orders(redis_server, redis):
    """``orders`` with the groups email, grp\\xff\\xfe (raw bytes) and points, one dead letter each."""
    from streams_app.deadletters import store as deadletters

    raw = redis_server.client(decode_responses=False)
    letters = {group: dead_letter(redis, [{"n": n}], stream="orders", group=group)[0]
               for n, group in enumerate(("email", "points"))}
    raw.xgroup_create("orders", BAD, id="$")
    entry = raw.xadd("orders", {b"payload": b'{"n": 9}'})
    raw.xreadgroup(BAD, b"c", {"orders": ">"})
    [(_, letters[SHOWN])] = deadletters.move(raw, "orders", BAD, [(entry, "RuntimeError: x", "")]).moved
    return raw, letters


def replayed_to(raw):
    """The groups that replayed entries of ``orders`` are for, as Redis holds them."""
    return sorted(f[b"shoal:target_group"] for _, f in raw.xrange("orders") if b"shoal:target_group" in f)


@pytest.mark.parametrize("group", ["points", SHOWN])
def test_replaying_selected_dead_letters_beside_a_group_not_utf8_replays_them_to_the_real_group(
        staff_client, orders, group):
    raw, letters = orders
    client = staff_client("streams_app.replay_deadletter")
    client.get(GROUPS)
    pk = DeadLetter.objects.get(entry_id=letters[group]).pk
    response = client.post(LETTERS, {"action": "replay_selected", "_selected_action": [pk], "post": "yes"},
                           follow=True)
    assert response.status_code == 200
    assert any(m.startswith("Replayed 1 dead letter") for m in messages_of(response)), messages_of(response)
    assert replayed_to(raw) == [group.encode() if group == "points" else BAD]
    assert {i.decode() for i, _ in raw.xrange(keys.dead_letter_key("orders"))} == set(letters.values()) - {letters[group]}


def test_an_edited_replay_beside_a_group_not_utf8_is_done(staff_client, orders):
    raw, letters = orders
    client = staff_client("streams_app.replay_deadletter")
    client.get(GROUPS)
    pk = DeadLetter.objects.get(entry_id=letters["points"]).pk
    response = client.post(f"{LETTERS}{pk}/replay/", {"payload": '{"n": 42}', "post": "yes"}, follow=True)
    assert response.status_code == 200
    assert replayed_to(raw) == [b"points"]
    [payload] = [f[b"payload"] for _, f in raw.xrange("orders") if b"shoal:target_group" in f]
    assert payload == b'{"n":42}'


def test_the_replay_command_beside_a_group_not_utf8_counts_and_replays_the_groups_letters(orders, capsys):
    raw, letters = orders
    call_command("replay", "orders", "--group", "points", "--all", "--dry-run")
    assert "1" in capsys.readouterr().out and replayed_to(raw) == []
    call_command("replay", "orders", "--group", SHOWN, "--all")
    assert replayed_to(raw) == [BAD]


def test_find_a_message_lists_every_group_of_a_stream_with_a_group_not_utf8(staff_client, orders):
    raw, letters = orders
    client = staff_client()
    client.get(GROUPS)
    first = raw.xrange("orders", count=1)[0][0].decode()
    response = client.get(f"{GROUPS}find/", {"stream": "orders", "q": first})
    assert not any("does not exist" in m for m in messages_of(response)), messages_of(response)
    [found] = response.context["results"]
    assert {p.group for p in found.places} == {"email", SHOWN, "points"}
    assert {p.group: p.state for p in found.places}["email"] == "dead-lettered"



def test_messages_that_name_a_stream_or_a_parameter_keep_its_case_on_the_page(staff_client, redis):
    """Django's admin shows each message with its first letter capitalised: none may start with a name."""
    from tests.streams_app.admin.fixtures import pending

    [entry] = pending(redis, "orders", "a", [{"n": 1}])
    client = staff_client("streams_app.claim_pending")
    client.get(GROUPS)
    url = f"{GROUPS}{ConsumerGroup.objects.get(name='a').pk}/pending/"
    claimed = client.post(url, {"action": "claim", "entry": [entry], "consumer": "nobody-here", "post": "yes"},
                          follow=True).content.decode()
    assert "orders:a has no consumer named" in claimed and "Orders:a" not in claimed
    filtered = client.get(url, {"min_idle": "abc"}).content.decode()
    assert "min_idle=&#x27;abc&#x27; is not a number" in filtered and "Min_idle" not in filtered


# -- F4: a name not UTF-8 and another spelled as its escaped text are told apart or left alone ----------

def test_two_groups_shown_as_the_same_name_are_named_and_neither_is_acted_on(staff_client, redis_server, redis):
    raw = redis_server.client(decode_responses=False)
    raw.xgroup_create("orders", BAD, id="$", mkstream=True)
    raw.xgroup_create("orders", SHOWN.encode(), id="$")  # spelled with backslashes
    ids = [raw.xadd("orders", {b"payload": b"{}"}).decode() for _ in range(4)]
    raw.xreadgroup(BAD, b"c", {"orders": ">"})
    raw.xreadgroup(SHOWN.encode(), b"lit", {"orders": ">"}, count=1)
    client = staff_client("streams_app.ack_pending", "streams_app.claim_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(name=SHOWN)
    url = f"{GROUPS}{group.pk}/pending/"
    for page in (client.get(url), client.get(f"{GROUPS}{group.pk}/change/")):
        assert any(f"Two groups of orders are shown as {SHOWN}" in m for m in messages_of(page)), messages_of(page)
        assert [c.name for c in page.context["consumers"]] == []  # neither group's, passed off as this one's
    acked = client.post(url, {"action": "ack", "entry": ids[:1], "post": "yes"}, follow=True)
    assert any("Nothing was done" in m for m in messages_of(acked)), messages_of(acked)
    assert raw.xpending("orders", BAD)["pending"] == 4 and raw.xpending("orders", SHOWN.encode())["pending"] == 1


def test_two_consumers_shown_as_the_same_name_are_neither_claimed_to_nor_filtered_on(staff_client, redis_server,
                                                                                    redis):
    from tests.streams_app.admin.fixtures import pending

    raw = redis_server.client(decode_responses=False)
    ids = pending(redis, "orders", "a", [{"n": n} for n in range(3)])
    raw.xclaim("orders", "a", b"cons\xc3\x28", 0, [ids[0]])
    raw.xclaim("orders", "a", b"cons\\xc3(", 0, [ids[1]])  # spelled with a backslash
    client = staff_client("streams_app.claim_pending")
    client.get(GROUPS)
    url = f"{GROUPS}{ConsumerGroup.objects.get(name='a').pk}/pending/"
    shown = "cons\\xc3("
    filtered = client.get(url, {"consumer": "=" + shown})
    assert filtered.context["entries"] == []
    assert any(f"Two consumers of a are shown as {shown}" in m for m in messages_of(filtered)), messages_of(filtered)
    claimed = client.post(url, {"action": "claim", "entry": [ids[2]], "consumer": "=" + shown, "post": "yes"},
                          follow=True)
    assert any("Nothing was done" in m for m in messages_of(claimed)), messages_of(claimed)
    owners = {r["message_id"].decode(): r["consumer"] for r in raw.xpending_range("orders", "a", "-", "+", 10)}
    assert owners == {ids[0]: b"cons\xc3\x28", ids[1]: b"cons\\xc3(", ids[2]: b"c1"}


def test_a_replay_for_a_name_shown_alike_never_replays_the_other_groups_letters(staff_client, orders):
    raw, letters = orders
    raw.xgroup_create("orders", SHOWN.encode(), id="$")  # spelled with backslashes, shown as BAD is
    client = staff_client("streams_app.replay_deadletter")
    client.get(GROUPS)
    pk = DeadLetter.objects.get(entry_id=letters[SHOWN]).pk  # BAD's letter
    said = messages_of(client.post(LETTERS, {"action": "replay_selected", "_selected_action": [pk], "post": "yes"},
                                   follow=True))
    assert any("dead-lettered by another group" in m for m in said), said
    assert replayed_to(raw) == [] and raw.xlen(keys.dead_letter_key("orders")) == 3
