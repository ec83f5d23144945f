"""DiscoveryClient.request against real local HTTP servers."""
import threading
from collections import Counter

import pytest
import requests

from discovery_app.client import DiscoveryClient
from tests.waiting import wait_for


@pytest.fixture
def client():
    client = DiscoveryClient(strategy="round-robin", listen=False, breaker_failures=2)
    yield client
    client.close()


def test_no_request_fails_while_one_of_two_servers_stops(registry, http_service, client):
    a, b = http_service("a"), http_service("b")
    registry.register("web", "127.0.0.1", a.port)
    registry.register("web", "127.0.0.1", b.port)
    results, errors = [], []
    lock = threading.Lock()

    def caller():
        for n in range(40):
            try:
                response = client.request("web", "GET", f"/item/{n}", timeout=5)
                with lock:
                    results.append((response.status_code, response.text.split()[0]))
            except Exception as exc:  # noqa: BLE001 - any failure is what the test counts
                with lock:
                    errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(results) >= 40, timeout=30, what="40 answers before stopping server a")
    a.stop()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(results) == 160 and {status for status, _ in results} == {200}
    served = Counter(name for _, name in results)
    assert served["a"] >= 1 and served["b"] >= 1
    # a was ejected after BREAKER_FAILURES connection errors: the rest went straight to b.
    assert client.breakers.state(next(i for i in client.registry.instances("web") if i.port == a.port).instance_id) == "open"


def test_idempotent_request_is_retried_on_another_instance_after_a_5xx(registry, http_service, client):
    broken, good = http_service("broken", status=503), http_service("good")
    registry.register("web", "127.0.0.1", broken.port)
    registry.register("web", "127.0.0.1", good.port)
    answers = [client.request("web", "PUT", "/x").text.split()[0] for _ in range(4)]
    assert answers == ["good"] * 4
    assert len(broken.hits) == 2  # then its breaker opened (2 failures)


def test_post_is_not_sent_twice(registry, http_service, client):
    broken, good = http_service("broken", status=500), http_service("good")
    registry.register("web", "127.0.0.1", broken.port)
    registry.register("web", "127.0.0.1", good.port)
    statuses = sorted(client.request("web", "POST", "/orders", json={"n": 1}).status_code for _ in range(2))
    assert statuses == [200, 500]  # round-robin: one POST each, the 5xx handed back as it was
    assert len(broken.hits) == 1 and len(good.hits) == 1


def test_a_post_whose_connection_is_refused_goes_to_another_instance(registry, http_service, closed_port, client):
    # Refused: nothing was sent (a stopping gunicorn refuses new connections at once), so even a POST is
    # safe to send elsewhere; a POST that reached an instance is still never sent twice (above).
    good = http_service("good")
    registry.register("web", "127.0.0.1", closed_port)
    registry.register("web", "127.0.0.1", good.port)
    with pytest.raises(requests.ConnectionError):  # retry=False: never, not even that
        for _ in range(2):  # round-robin: one of them goes to the closed port first
            client.request("web", "POST", "/orders", retry=False)
    sent = len(good.hits)
    answers = [client.request("web", "POST", "/orders", json={"n": n}).text for n in range(4)]
    assert answers == ["good /orders"] * 4
    assert len(good.hits) == sent + 4  # each POST once


def test_connection_error_on_the_only_instance_is_raised(registry, closed_port, client):
    registry.register("web", "127.0.0.1", closed_port)
    with pytest.raises(requests.ConnectionError):
        client.request("web", "GET", "/")
    assert client.inflight(client.registry.instances("web")[0]) == 0


def test_the_retry_log_says_where_the_call_goes_again(registry, http_service, closed_port, caplog):
    # Trial t34, finding 4: a call whose only instance (here a FALLBACKS URL) refused logged "retrying on
    # another instance" when there was none; the second attempt went to the same URL.
    client = DiscoveryClient(strategy="round-robin", listen=False, fallbacks={"fb": [f"http://127.0.0.1:{closed_port}/base"]})
    try:
        with caplog.at_level("INFO", logger="discovery_app"), pytest.raises(requests.ConnectionError):
            client.request("fb", "GET", "/x/y", timeout=2)
        assert "another instance" not in caplog.text
        assert f"retrying on the same instance, the only one (http://127.0.0.1:{closed_port}/base)" in caplog.text
        caplog.clear()
        good = http_service("good")
        registry.register("web", "127.0.0.1", closed_port)
        registry.register("web", "127.0.0.1", good.port)
        with caplog.at_level("INFO", logger="discovery_app"):
            for _ in range(2):  # round-robin: one of them goes to the closed port first
                assert client.request("web", "GET", "/", timeout=2).status_code == 200
        assert f"retrying on another instance (http://127.0.0.1:{good.port})" in caplog.text
    finally:
        client.close()


def test_dead_instance_on_a_closed_port_is_ejected_then_retried_after_cooldown(registry, http_service, closed_port, clock):
    live = http_service("live")
    dead = registry.register("web", "127.0.0.1", closed_port)
    registry.register("web", "127.0.0.1", live.port)
    client = DiscoveryClient(strategy="round-robin", listen=False, breaker_failures=2, breaker_cooldown=30, clock=clock)
    try:
        for _ in range(10):
            assert client.request("web", "GET", "/").status_code == 200
        assert client.breakers.state(dead.instance_id) == "open"
        hits = len(live.hits)
        for _ in range(10):
            client.request("web", "GET", "/")
        assert len(live.hits) == hits + 10  # no attempt went to the dead port any more
        revived = http_service("revived", port=closed_port)
        clock.advance(30)
        names = [client.request("web", "GET", "/").text.split()[0] for _ in range(4)]
        assert "revived" in names  # the half-open trial succeeded
        assert client.breakers.state(dead.instance_id) == "closed"
        assert len(revived.hits) >= 1
    finally:
        client.close()
