"""The demo's handlers (README's tour), run in process with streams_app.testing: no Redis, no runconsumer."""
import importlib

import pytest

from streams_app import publish
from streams_app.registry import _registry
from streams_app.testing import Status, capture_publishes, drain


@pytest.fixture
def demo_consumers():
    saved = dict(_registry)
    import demo.consumers

    importlib.reload(demo.consumers)  # registers orders:email and orders:points (demo is not an installed app here)
    yield
    _registry.clear()
    _registry.update(saved)


def test_an_order_reaches_both_groups(demo_consumers):
    with capture_publishes() as published:
        publish("orders", {"order_id": 1, "total": 120, "customer": "ada"})
        report = drain(published)
    handled = {(d.group, d.status) for d in report if d.group in ("email", "points")}
    assert handled == {("email", Status.HANDLED), ("points", Status.HANDLED)}


def test_the_tours_failing_order_is_a_dead_letter_after_three_deliveries_a_second_or_two_apart(demo_consumers):
    with capture_publishes() as published:
        publish("orders", {"order_id": 2, "fail": "mail server down"})
        report = drain(published)
    [email] = [d for d in report if d.group == "email"]
    assert email.status is Status.DEAD_LETTERED and email.deliveries == 3
    assert str(email.error) == "order 2: mail server down"
    assert email.retry_delays == [1, 2]  # what runconsumer waits between the deliveries
    assert [d.status for d in report if d.group == "points"] == [Status.HANDLED]
