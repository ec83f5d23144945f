"""What a second on-call operator's trial of the control room found (issue 33, trial b): keys of
another type, the dead letter's own buttons, a resubmitted task retry."""
import pytest

from streams_app import keys
from streams_app.models import ConsumerGroup
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
