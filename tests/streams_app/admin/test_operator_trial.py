"""What an on-call operator's trial of the control room found (issue 33), each through Django's test client."""
import pytest

from streams_app import keys, publish_many
from streams_app.admin import mirror
from streams_app.consuming.groups import ensure_group
from streams_app.models import ConsumerGroup, DeadLetter, Stream
from tests.streams_app.admin.fixtures import dead_letter, pending, staff_client  # noqa: F401

pytestmark = pytest.mark.django_db

GROUPS = "/admin/streams_app/consumergroup/"
LETTERS = "/admin/streams_app/deadletter/"


def messages_of(response):
    return [str(m) for m in response.context["messages"]]


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
    from streams_app.connection import get_connection
    from streams_app.reclaim import Reclaimer
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
