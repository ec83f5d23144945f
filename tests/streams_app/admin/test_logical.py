"""A partitioned stream in the admin: one logical stream with its partitions, a group's pending entries
across partitions. Through Django's test client, on a real Redis (single server and cluster)."""
import re

import pytest

from streams_app import publish_many
from streams_app.partitioning import partitions
from streams_app.admin.mirror import entry_sort_key
from streams_app.consuming.groups import ensure_group
from streams_app.models import ConsumerGroup, Stream
from tests.streams_app.admin.fixtures import staff_client  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.both_redis]

LOGICAL = "/admin/streams_app/stream/logical/?name=orders"
PENDING = "/admin/streams_app/consumergroup/logical-pending/?stream=orders&group=p"


@pytest.fixture
def orders(redis, settings):
    """orders in 3 partitions, 90 keyed messages; group p read 20 of each partition (60 pending, 30 not read)."""
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 3}}
    names = partitions.names("orders")
    for name in names:
        ensure_group(redis, name, "p", start="0")
    keys = [f"customer-{n}" for n in range(90)]
    publish_many("orders", [{"n": n} for n in range(90)], keys=keys)
    counts = {name: redis.xlen(name) for name in names}
    read = {}
    for name in names:
        [(_, entries)] = redis.xreadgroup("p", "c1", {name: ">"}, count=20)
        read[name] = [entry_id for entry_id, _ in entries]
    return names, counts, read


def test_a_logical_stream_shows_its_partitions_and_each_group_summed(staff_client, orders):
    names, counts, read = orders
    assert all(count > 20 for count in counts.values())  # every partition got enough to read 20
    page = staff_client().get(LOGICAL)
    assert page.status_code == 200
    html = page.content.decode()
    assert "partitioned stream of 3 partitions" in html and "90 entries" in html
    for name in names:
        stream = Stream.objects.get(name=name)
        assert f'href="/admin/streams_app/stream/{stream.pk}/change/">{name}</a>' in html
        group = ConsumerGroup.objects.get(stream=stream, name="p")
        assert (group.lag, group.pending) == (counts[name] - 20, 20)
        assert f'href="/admin/streams_app/consumergroup/{group.pk}/pending/">20</a>' in html
    assert "Group p: lag 30, " in html
    assert '<a href="/admin/streams_app/consumergroup/logical-pending/?stream=orders&amp;group=p">60 pending</a>' in html


def test_a_groups_pending_entries_across_partitions_oldest_first(staff_client, orders):
    names, _, read = orders
    html = staff_client().get(PENDING).content.decode()
    assert "60 entries pending in group p over the 3 partitions" in html
    rows = re.findall(r'<tr><td><a href="/admin/streams_app/consumergroup/(\d+)/pending/">([^<]+)</a></td>\s*<td>([^<]+)</td>', html)
    oldest = sorted((entry_sort_key(i), name, i) for name in names for i in read[name])[:50]
    assert [(name, entry_id) for _, name, entry_id in rows] == [(name, entry_id) for _, name, entry_id in oldest]
    for pk, name, _ in rows:
        assert ConsumerGroup.objects.get(pk=pk).stream.name == name  # each links to its partition's own page


def test_the_lists_link_partitions_to_their_logical_stream_and_filter_by_it(staff_client, orders, redis):
    names, _, _ = orders
    redis.xadd("jobs", {"payload": "{}"})
    client = staff_client()
    html = client.get("/admin/streams_app/stream/?logical=orders").content.decode()
    assert all(name in html for name in names) and ">jobs<" not in html
    assert '<a href="/admin/streams_app/stream/logical/?name=orders">orders</a> (2 of 3)' in html
    groups = client.get("/admin/streams_app/consumergroup/?logical=orders").content.decode()
    assert groups.count("pending in all 3 partitions") == 3


def test_logical_pages_need_staff_view_permission_and_a_partitioned_stream(client, staff_client, orders, django_user_model):
    for url in (LOGICAL, PENDING):
        response = client.get(url)
        assert response.status_code == 302 and response.url.startswith("/admin/login/")
    client.force_login(django_user_model.objects.create_user("nobody", password="x", is_staff=True))
    assert client.get(LOGICAL).status_code == 403
    assert client.get(PENDING).status_code == 403
    staff = staff_client()
    assert staff.get("/admin/streams_app/stream/logical/?name=jobs").status_code == 404
    assert staff.get("/admin/streams_app/consumergroup/logical-pending/?stream=nothing&group=p").status_code == 404


def test_a_logical_stream_without_a_consumer_in_the_web_process_shows_what_redis_holds(staff_client, redis, settings):
    """No @consumer of jn here: its partitions are read from Redis all the same (not "not in Redis yet")."""
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"jn": 4}}
    names = partitions.names("jn")
    publish_many("jn", [{"n": n} for n in range(10)], keys=[f"k{n}" for n in range(10)])
    ensure_group(redis, names[0], "ledger", start="0")
    html = staff_client().get("/admin/streams_app/stream/logical/?name=jn").content.decode()
    assert "10 entries" in html and "not in Redis yet" not in html
    for name in names:
        assert f'/change/">{name}</a>' in html
    assert "Group ledger: lag " in html
    # Dropped from STREAMS["PARTITIONS"] while Redis still records it: the page follows the record.
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {}}
    html = staff_client().get("/admin/streams_app/stream/logical/?name=jn").content.decode()
    assert "partitioned stream of 4 partitions" in html and "10 entries" in html


def test_the_logical_pending_page_without_a_group_is_not_found(staff_client, orders):
    page = staff_client().get("/admin/streams_app/consumergroup/logical-pending/?stream=orders")
    assert page.status_code == 404
    page = staff_client().get("/admin/streams_app/consumergroup/logical-pending/?stream=orders&group=")
    assert page.status_code == 404


def test_the_logical_stream_page_follows_a_repartition_draining_partitions_included(staff_client, redis, settings):
    from streams_app.partitioning import layout
    from streams_app.operations.repartition import repartition

    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"jn": 2}}
    old = partitions.names("jn")
    publish_many("jn", [{"n": n} for n in range(10)], keys=[f"k{n}" for n in range(10)])
    ensure_group(redis, old[0], "ledger", start="0")  # unread: the drain waits, the old partitions stay read
    layout.SWITCH_SECONDS, switch = 0.2, layout.SWITCH_SECONDS
    try:
        repartition("jn", 4, say=lambda text: None, wait=False)
    finally:
        layout.SWITCH_SECONDS = switch
    new = partitions.names("jn")
    html = staff_client().get("/admin/streams_app/stream/logical/?name=jn").content.decode()
    assert "partitioned stream of 6 partitions" in html, html  # 2 draining, 4 new
    for name in old + new:
        assert f">{name}</a>" in html
