"""The demo's web-like writer: each order is a model write and its event, through the transactional outbox."""
import random
import signal
import threading

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, transaction

from demo.models import Order
from streams_app import publish


class Command(BaseCommand):
    help = ("Save a trickle of demo orders, each publishing to the 'orders' stream through the outbox in the same "
            "transaction, until stopped. The relay (runreclaimer --relay, or runrelay) moves them to Redis.")

    def add_arguments(self, parser):
        parser.add_argument("--rate", type=float, default=1.0, help="Orders per second (default 1).")

    def handle(self, *args, rate, **options):
        if rate <= 0:
            raise CommandError("--rate must be above 0.")
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        while True:
            try:
                # The order and its event commit together or not at all; Redis being away only delays the event.
                with transaction.atomic():
                    order = Order.objects.create(customer=random.choice(["ann", "bo", "cy"]), total=random.randint(5, 500))
                    publish("orders", {"order_id": order.pk, "customer": order.customer, "total": order.total},
                            key=f"order-{order.pk}", maxlen=10_000, outbox=True)
                self.stdout.write(f"saved order {order.pk}; its event waits in the outbox for the relay")
            except DatabaseError as exc:
                self.stderr.write(f"could not save the order ({exc}); retrying")
            if stop.wait(1 / rate):
                return
