"""A hung Redis (SIGSTOP: connections open, nothing answers) costs an admin page its short timeout, not 30 s."""
import signal
import time

import pytest

from streams_app.admin import mirror
from streams_app.models import ConsumerGroup, DeadLetter
from tests.streams_app.admin.fixtures import dead_letter, pending, staff_client  # noqa: F401

pytestmark = pytest.mark.django_db

# Loose: the default ADMIN_REDIS_TIMEOUT is 2 s; the pool's socket timeout (30 s) is what is ruled out.
PAGE_BOUND = 10.0


@pytest.fixture
def frozen_redis(redis_factory, use_redis):
    server = redis_factory()
    use_redis(server)
    client = server.client()
    frozen = []

    def freeze():
        server.process.send_signal(signal.SIGSTOP)
        frozen.append(True)

    yield client, freeze
    if frozen:
        server.process.send_signal(signal.SIGCONT)


def timed_get(client, url):
    started = time.monotonic()
    response = client.get(url)
    return response, time.monotonic() - started


def test_every_admin_page_answers_from_the_mirror_within_its_timeout_when_redis_hangs(staff_client, frozen_redis):
    redis, freeze = frozen_redis
    dead_letter(redis, [{"n": 1}], group="b")
    pending(redis, "jobs", "a", [{"n": 2}])
    mirror.sync_all()
    group = ConsumerGroup.objects.get(name="a")
    letter = DeadLetter.objects.get()
    client = staff_client("streams_app.claim_pending", "streams_app.ack_pending", "streams_app.replay_deadletter")
    client.get("/admin/")  # connections are open when Redis freezes, as in production
    freeze()
    for url in ["/admin/", "/admin/streams_app/stream/", "/admin/streams_app/consumergroup/",
                f"/admin/streams_app/consumergroup/{group.pk}/change/",
                f"/admin/streams_app/consumergroup/{group.pk}/pending/",
                "/admin/streams_app/deadletter/", f"/admin/streams_app/deadletter/{letter.pk}/change/"]:
        response, took = timed_get(client, url)
        assert took < PAGE_BOUND, f"{url} took {took:.1f} s"
        assert response.status_code == 200, url
        html = response.content.decode()
        if "/pending/" in url or url.endswith(("stream/", "consumergroup/", "deadletter/")):
            assert "The last copy from Redis did not complete" in html, url
    pending_page = client.get(f"/admin/streams_app/consumergroup/{group.pk}/pending/")
    assert any("Redis is unreachable" in str(m) for m in pending_page.context["messages"])
    assert pending_page.context["total"] == 1  # the mirror's count
    started = time.monotonic()
    action = client.post(f"/admin/streams_app/consumergroup/{group.pk}/pending/",
                         {"action": "ack", "entry": [pending_page.context["group"].last_delivered_id], "post": "yes"})
    assert time.monotonic() - started < PAGE_BOUND and action.status_code == 302


def test_a_page_asks_a_hung_redis_once_then_fails_at_once(frozen_redis, settings):
    import redis as redis_lib

    from shoal_common.page_redis import OneAttempt
    from streams_app.redis.connection import web_connection

    settings.STREAMS = {"ADMIN_REDIS_TIMEOUT": 0.5}
    client, freeze = frozen_redis
    conn = OneAttempt(web_connection())
    assert conn.ping()
    freeze()
    started = time.monotonic()
    with pytest.raises(redis_lib.TimeoutError):
        conn.xlen("jobs")
    first = time.monotonic() - started
    assert 0.4 < first < 5  # its own timeout, no retry
    started = time.monotonic()
    with pytest.raises(redis_lib.ConnectionError, match="not asked again on this page"):
        conn.xinfo_groups("jobs")
    with pytest.raises(redis_lib.ConnectionError):
        pipe = conn.pipeline(transaction=False)
        pipe.xlen("jobs")
        pipe.execute()
    assert time.monotonic() - started < 0.2


def test_a_process_whose_first_connection_meets_a_hung_redis_shows_the_last_copy_within_the_timeout(
        staff_client, frozen_redis, settings, redis_factory):
    """Issue 33, item 1: a gunicorn worker started during an outage asks Redis first whether it is a
    cluster (shoal_common.redisconn.probe_cluster_mode); that question was a 500 after 5 s."""
    settings.STREAMS = {"ADMIN_REDIS_TIMEOUT": 0.5}
    redis, freeze = frozen_redis
    dead_letter(redis, [{"n": 1}], group="a")
    mirror.sync_all()
    group = ConsumerGroup.objects.get(name="a")
    letter = DeadLetter.objects.get()
    # A process that has not talked to this Redis yet: the same server under a URL not probed before.
    port = redis.connection_pool.connection_kwargs["port"]
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{port}"}}
    client = staff_client("streams_app.replay_deadletter")
    freeze()
    for url in ["/admin/", "/admin/streams_app/consumergroup/", f"/admin/streams_app/consumergroup/{group.pk}/change/",
                f"/admin/streams_app/consumergroup/{group.pk}/pending/", "/admin/streams_app/deadletter/",
                f"/admin/streams_app/deadletter/{letter.pk}/change/",
                "/admin/streams_app/consumergroup/find/?stream=jobs&q=1-0"]:
        response, took = timed_get(client, url)
        assert response.status_code == 200, url
        assert took < 0.5 + 1.5, f"{url} took {took:.1f} s"  # one probe, within the admin's timeout
    page = client.get("/admin/streams_app/consumergroup/").content.decode()
    assert "The last copy from Redis did not complete" in page
    started = time.monotonic()
    action = client.post("/admin/streams_app/deadletter/", {"action": "replay_selected", "_selected_action": [letter.pk],
                                                            "index": "0", "post": "yes"}, follow=True)
    assert time.monotonic() - started < 2.0 and action.status_code == 200
    assert any("Redis" in str(m) for m in action.context["messages"]), list(action.context["messages"])
    assert DeadLetter.objects.count() == 1
