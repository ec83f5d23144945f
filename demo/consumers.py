"""Two groups on one stream: each receives every order (fan-out)."""
import logging

from streams_app import consumer

logger = logging.getLogger("demo")


@consumer("orders", group="email")
def send_confirmation(message):
    logger.info("email: confirmation for order %s (entry %s)", message.payload.get("order_id"), message.id)


@consumer("orders", group="points")
def add_points(message):
    order = message.payload
    logger.info("points: +%s points for customer %s", int(order.get("total", 0) // 10), order.get("customer"))
