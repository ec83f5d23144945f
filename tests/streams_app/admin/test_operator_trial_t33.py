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


# -- issue 49: a name not UTF-8 and another spelled as its escaped text are both reachable ---------

BYTE, LITERAL = b"\xff", b"\\xff"  # the byte 0xFF; the four characters \xff
SHOWN_AS = {BYTE: "\\xff", LITERAL: "\\\\xff"}  # the byte escaped, the backslash doubled


@pytest.fixture
def twins(redis_server, redis):
    """``orders`` with a group named BYTE and one named LITERAL, one pending entry each (read by c1 and c2)."""
    raw = redis_server.client(decode_responses=False)
    raw.xgroup_create("orders", BYTE, id="$", mkstream=True)
    raw.xgroup_create("orders", LITERAL, id="$")
    first, second = (raw.xadd("orders", {b"payload": b"{}"}).decode() for _ in range(2))
    raw.xreadgroup(BYTE, b"c1", {"orders": ">"}, count=1)
    raw.xreadgroup(LITERAL, b"c2", {"orders": ">"}, count=2)
    raw.xack("orders", LITERAL, first)  # each group holds a different entry
    return raw, {BYTE: first, LITERAL: second}


@pytest.mark.parametrize("name", [BYTE, LITERAL, b"grp\xff\xfe", b"a\x00b", b"a\\\\b", "caf\u00e9", "plain", b""])
def test_a_shown_name_reads_back_as_the_bytes_redis_holds_and_two_names_are_never_shown_alike(name):
    from streams_app.redis.lag import from_shown, name_bytes, to_shown

    assert name_bytes(from_shown(to_shown(name))) == name_bytes(name)
    assert "\x00" not in to_shown(name)  # a form sends it back, PostgreSQL stores it
    assert to_shown(BYTE) != to_shown(LITERAL)
    assert to_shown("plain") == from_shown("plain") == "plain"  # the common name: no escaping, same URLs


def pending_ids(raw, group):
    return [r["message_id"].decode() for r in raw.xpending_range("orders", group, "-", "+", 10)]


def test_two_groups_whose_shown_names_once_collided_are_listed_apart_each_with_its_own_entries(staff_client,
                                                                                            twins):
    raw, ids = twins
    client = staff_client()
    listed = client.get(GROUPS)
    rows = {g.name: g for g in ConsumerGroup.objects.filter(stream__name="orders")}
    assert set(rows) == set(SHOWN_AS.values())
    assert all(f"{GROUPS}{g.pk}/pending/" in listed.content.decode() for g in rows.values())
    for group, consumer in ((BYTE, "c1"), (LITERAL, "c2")):
        shown = SHOWN_AS[group]
        page = client.get(f"{GROUPS}{rows[shown].pk}/pending/")
        assert not any("shown as" in m for m in messages_of(page)), messages_of(page)
        assert page.context["total"] == 1 and [e["id"] for e in page.context["entries"]] == [ids[group]]
        assert [c.name for c in page.context["consumers"]] == [consumer]
        assert [c.name for c in client.get(f"{GROUPS}{rows[shown].pk}/change/").context["consumers"]] == [consumer]


@pytest.mark.parametrize("acked, kept", [(BYTE, LITERAL), (LITERAL, BYTE)], ids=["byte", "literal"])
def test_an_ack_from_either_groups_page_acknowledges_in_that_group_only(staff_client, twins, acked, kept):
    raw, ids = twins
    client = staff_client("streams_app.ack_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(stream__name="orders", name=SHOWN_AS[acked])
    done = client.post(f"{GROUPS}{group.pk}/pending/", {"action": "ack", "entry": [ids[acked]], "post": "yes"},
                       follow=True)
    assert any(m.startswith("Acknowledged 1 pending entry") for m in messages_of(done)), messages_of(done)
    assert pending_ids(raw, acked) == [] and pending_ids(raw, kept) == [ids[kept]]
    assert {g["name"] for g in raw.xinfo_groups("orders")} == {BYTE, LITERAL}  # no group made under a shown name


def test_a_claim_from_the_literal_groups_page_moves_its_entry_to_a_consumer_of_that_group(staff_client, twins):
    raw, ids = twins
    raw.xgroup_createconsumer("orders", LITERAL, b"c3")
    client = staff_client("streams_app.claim_pending")
    client.get(GROUPS)
    group = ConsumerGroup.objects.get(stream__name="orders", name=SHOWN_AS[LITERAL])
    claimed = client.post(f"{GROUPS}{group.pk}/pending/",
                          {"action": "claim", "entry": [ids[LITERAL]], "consumer": "=c3", "post": "yes"}, follow=True)
    assert any(m.startswith("Claimed 1 pending entry") for m in messages_of(claimed)), messages_of(claimed)
    assert [r["consumer"] for r in raw.xpending_range("orders", LITERAL, "-", "+", 10)] == [b"c3"]
    assert [r["consumer"] for r in raw.xpending_range("orders", BYTE, "-", "+", 10)] == [b"c1"]


def test_two_consumers_whose_shown_names_once_collided_are_each_filtered_on_and_claimed_to(staff_client,
                                                                                        redis_server, redis):
    from tests.streams_app.admin.fixtures import pending

    raw = redis_server.client(decode_responses=False)
    ids = pending(redis, "orders", "a", [{"n": n} for n in range(3)])
    raw.xclaim("orders", "a", b"cons\xc3\x28", 0, [ids[0]])
    raw.xclaim("orders", "a", b"cons\\xc3(", 0, [ids[1]])  # spelled with a backslash
    client = staff_client("streams_app.claim_pending")
    client.get(GROUPS)
    url = f"{GROUPS}{ConsumerGroup.objects.get(name='a').pk}/pending/"
    owners = {name for _, name, _ in client.get(url).context["owners"]}
    assert {"cons\\xc3(", "cons\\\\xc3("} <= owners
    for shown, entry in (("cons\\xc3(", ids[0]), ("cons\\\\xc3(", ids[1])):
        assert [e["id"] for e in client.get(url, {"consumer": "=" + shown}).context["entries"]] == [entry]
    claimed = client.post(url, {"action": "claim", "entry": [ids[2]], "consumer": "=cons\\\\xc3(", "post": "yes"},
                          follow=True)
    assert any(m.startswith("Claimed 1 pending entry") for m in messages_of(claimed)), messages_of(claimed)
    owners = {r["message_id"].decode(): r["consumer"] for r in raw.xpending_range("orders", "a", "-", "+", 10)}
    assert owners == {ids[0]: b"cons\xc3\x28", ids[1]: b"cons\\xc3(", ids[2]: b"cons\\xc3("}


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
