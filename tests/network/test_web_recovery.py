"""The web tier's Redis use and the discovery client through a TCP proxy (tests/netproxy.py) that
blackholes every connection for longer than the shared pool's socket timeout, as a NAT or
load-balancer drop does: after the heal, /readyz, the admin's Redis reads, the /metrics scrape, the
broadcast listener (each gunicorn worker runs one) and DiscoveryClient.resolve() see Redis again within the bound issue 31 sets (15 s), with the default
settings. Blackholed connections stay dead after the heal (a dropped NAT entry does not come back),
so whatever a pool or a subscription kept from before the fault must not be trusted again.
"""
import json
import os
import time
import uuid

import pytest

from discovery_app.client import DiscoveryClient
from discovery_app.registry import ServiceRegistry
from streams_app import broadcast
from streams_app.admin import mirror
from streams_app.models import ConsumerGroup
from tests.conftest import _point_django_at
from tests.streams_app.admin.fixtures import pending, staff_client  # noqa: F401
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

RECOVERY_BOUND = 15  # seconds after the heal (issue 31; docs/consuming.md "Network faults")
FAULT = 12  # seconds: longer than the shared pool's 5 s socket timeout (and the admin's and discovery's own)


def _metrics_scrape_ok(client):
    body = client.get("/metrics").content.decode()
    return "shoal_backlog_scrape_ok 1.0" in body


def _readyz(client):
    response = client.get("/readyz")
    return response.status_code, json.loads(response.content)["checks"]["redis"]


def _broadcast_reaches_this_process():
    """A ``ping`` broadcast, answered by this process's listener (a hash field under its pid)."""
    from streams_app.redis.connection import get_connection

    key = f"shoal:broadcast:ping:{uuid.uuid4().hex}"
    broadcast.broadcast("ping", {"reply_to": key})
    try:
        return wait_for(lambda: str(os.getpid()) in {k.decode() for k in get_connection().hkeys(key)}, timeout=1,
                        what="the ping's reply")
    except AssertionError:
        return False


def _pending_page(client, group):
    """(entries pending as the page counts them, whether it says Redis is unreachable)."""
    page = client.get(f"/admin/streams_app/consumergroup/{group.pk}/pending/")
    assert page.status_code == 200
    unreachable = any("unreachable" in str(m) for m in page.context["messages"])
    return page.context["total"], unreachable


def test_the_web_tier_and_discovery_see_redis_again_soon_after_a_blackhole(
        redis, redis_server, net_proxy, settings, staff_client):  # noqa: F811
    pending(redis, "jobs", "a", [{"n": 1}])
    client = staff_client("streams_app.claim_pending")
    # Everything below goes through the proxy: the web tier's shared pool, the admin's, the scrape's,
    # the readiness probe's and discovery's (and the discovery listener's subscription).
    _point_django_at(settings, net_proxy.url)
    ServiceRegistry().register("billing", "10.0.0.1", 8001, instance_id="billing-a")
    discovery = DiscoveryClient()
    listener = broadcast.start_listener()
    try:
        wait_for(listener.subscribed.is_set, timeout=10, what="the broadcast listener subscribed")
        assert _broadcast_reaches_this_process()
        discovery.resolve("billing")
        assert discovery.wait_listening(10)
        # Read again after the subscription (which drops the cache): fresh now, so the client goes to
        # Redis only when told of a change or after CACHE_TTL, as a busy client does.
        assert discovery.resolve("billing").port == 8001
        mirror.sync_all()
        group = ConsumerGroup.objects.get(name="a")
        # Pooled connections exist when the fault comes, as in production.
        assert _readyz(client) == (200, "ok")
        assert _metrics_scrape_ok(client)
        assert _pending_page(client, group) == (1, False)

        net_proxy.blackhole()
        fault_started = time.monotonic()
        # Used during the fault, as a live web tier is: connections time out in the middle of commands.
        assert _readyz(client)[0] == 503
        assert not _metrics_scrape_ok(client)
        assert _pending_page(client, group)[1]
        assert discovery.resolve("billing").port == 8001  # the cached instance
        time.sleep(max(0.0, FAULT - (time.monotonic() - fault_started)))  # the fault itself is under test
        net_proxy.heal()
        healed = time.monotonic()

        # Changes made while the web tier and the client are away: each must be seen through the proxy.
        redis.xadd("jobs", {"payload": json.dumps({"n": 2})})
        redis.xreadgroup("a", "c1", {"jobs": ">"})
        ServiceRegistry(redis_server.client(decode_responses=False)).register(
            "billing", "10.0.0.2", 8002, instance_id="billing-b")
        recovered = {}

        def see(name, condition):
            def check():
                if name not in recovered and condition():
                    recovered[name] = time.monotonic() - healed
                return name in recovered
            return check

        checks = [
            see("readyz", lambda: _readyz(client) == (200, "ok")),
            see("metrics", lambda: _metrics_scrape_ok(client)),
            see("admin", lambda: _pending_page(client, group) == (2, False)),
            see("broadcast", _broadcast_reaches_this_process),
            see("discovery", lambda: {i.port for i in discovery.instances("billing")} == {8001, 8002}),
        ]
        try:
            wait_for(lambda: all([check() for check in checks]), timeout=RECOVERY_BOUND, interval=0.2,
                     what=f"/readyz, /metrics, the admin, broadcast and discovery seeing Redis within {RECOVERY_BOUND} s "
                          f"of the heal")
        finally:
            print(f"recovered after the heal (s): {({k: round(v, 1) for k, v in recovered.items()})}")
    finally:
        broadcast.stop_listener()
        discovery.close()


def test_a_real_gunicorn_answers_readyz_and_scrapes_redis_again_soon_after_a_blackhole(tmp_path, redis, net_proxy):
    from tests.serving.gunicorn_process import Gunicorn

    web = Gunicorn(tmp_path / "gunicorn", net_proxy.url, workers=2).start()
    try:
        for _ in range(4):  # both workers' pools hold connections when the fault comes
            assert web.get("/readyz")[0] == 200
            assert "shoal_backlog_scrape_ok 1.0" in web.get("/metrics")[1]
        net_proxy.blackhole()
        fault_started = time.monotonic()
        assert web.get("/readyz", timeout=20)[0] == 503
        assert "shoal_backlog_scrape_ok 0.0" in web.get("/metrics", timeout=20)[1]
        time.sleep(max(0.0, FAULT - (time.monotonic() - fault_started)))  # the fault itself is under test
        net_proxy.heal()
        healed = time.monotonic()

        def recovered():
            # Several in a row: each may land on either worker.
            return all(web.get("/readyz")[0] == 200 and "shoal_backlog_scrape_ok 1.0" in web.get("/metrics")[1]
                       for _ in range(6))

        wait_for(recovered, timeout=RECOVERY_BOUND, interval=0.2,
                 what=f"/readyz and /metrics answering from Redis within {RECOVERY_BOUND} s of the heal")
        print(f"gunicorn recovered {time.monotonic() - healed:.1f} s after the heal")
    finally:
        web.stop()
        if web.proc.returncode not in (0, None):
            print(web.output()[-3000:])
