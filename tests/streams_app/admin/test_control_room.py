"""Control room 2 (issue 16): per-group dead letters, consumer liveness, why an entry is pending, retry now."""
import pytest

from streams_app.admin import mirror
from streams_app.models import ConsumerGroup
from tests.streams_app.admin.fixtures import dead_letter, pending, staff_client  # noqa: F401

pytestmark = pytest.mark.django_db

GROUPS = "/admin/streams_app/consumergroup/"


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
