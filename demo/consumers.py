"""Two groups on one stream: each receives every order (fan-out).

The README's tour makes an order fail on purpose: ``email`` raises for an order with a ``fail``
field. Three deliveries a second or two apart, and it is a dead letter to replay from the admin.
"""
import logging

from streams_app import consumer

logger = logging.getLogger("demo")


@consumer("orders", group="email", max_deliveries=3, retry_backoff=(1, 2))
def send_confirmation(message):
    if message.payload.get("fail"):
        raise RuntimeError(f"order {message.payload.get('order_id')}: {message.payload['fail']}")
    logger.info("email: confirmation for order %s (entry %s)", message.payload.get("order_id"), message.id)


@consumer("orders", group="points")
def add_points(message):
    order = message.payload
    logger.info("points: +%s points for customer %s", int(order.get("total", 0) // 10), order.get("customer"))
