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
