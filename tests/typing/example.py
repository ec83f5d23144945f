"""The public API as a user's code calls it: `make lint` type-checks this file in strict mode (mypy.ini).

If a signature regresses (an annotation lost, a type narrowed), mypy fails here. tests/typing/test_types.py
checks the other way round: a wrong argument is an error.
"""
from __future__ import annotations

import datetime

from discovery_app.client import DiscoveryClient
from discovery_app.instance import Instance
from streams_app import Message, consumer, publish, publish_many
from streams_app.exceptions import PartialPublishError, PublishError, StreamsError
from streams_app.testing import Delivery, Published, Report, capture_publishes, drain, make_message, run_handlers


@consumer("orders", group="shipping", max_deliveries=3, retry_backoff=(1.0, 60.0), idempotent="db")
def ship(message: Message) -> None:
    order: dict[str, int] = message.payload
    publish("shipments", {"order": order["id"]}, key=message.key, headers={"from": message.stream})


@consumer("orders", group="audit", start="$")
async def audit(message: Message) -> None:
    assert message.deliveries >= 1 and message.group == "audit"


def view() -> str | None:
    entry_id: str | None = publish("orders", {"id": 1}, key="order-1", run_after=datetime.timedelta(minutes=5))
    ids: list[str] = publish_many("orders", [{"id": 2}, {"id": 3}], keys=["order-2", "order-3"], outbox=True)
    try:
        publish_many("orders", [{"id": 4}])
    except PartialPublishError as exc:
        ids = exc.ids
    except PublishError as exc:
        print(exc.index, exc.reason)
    except StreamsError:
        raise
    return entry_id or ids[0]


def a_test() -> None:
    with capture_publishes() as published:
        view()
        report: Report = drain(published)
    assert isinstance(published, Published)
    first: Delivery = report[0]
    assert first.handled and first.error is None and first.deliveries == 1
    again: Report = run_handlers(make_message({"id": 1}, stream="orders", key="k", deliveries=2), group="shipping")
    again.assert_handled()
    assert ship(make_message({"id": 1})) is None


def call_a_service(client: DiscoveryClient) -> str:
    instance: Instance = client.resolve("billing", tags=["eu"], version="2.*")
    with client.track(instance):
        pass
    client.report(instance, True)
    client.invalidate("billing")
    return client.resolve_url("billing") + str(client.inflight(instance))
