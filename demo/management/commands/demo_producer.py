import itertools
import random
import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from streams_app import publish
from streams_app.connection import TRANSIENT_ERRORS


class Command(BaseCommand):
    help = "Publish a trickle of demo orders to the 'orders' stream until stopped."

    def add_arguments(self, parser):
        parser.add_argument("--rate", type=float, default=1.0, help="Orders per second (default 1).")

    def handle(self, *args, rate, **options):
        if rate <= 0:
            raise CommandError("--rate must be above 0.")
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        for number in itertools.count(1):
            order = {"order_id": number, "customer": random.choice(["ann", "bo", "cy"]), "total": random.randint(5, 500)}
            try:
                entry_id = publish("orders", order, key=f"order-{number}", maxlen=10_000)
                self.stdout.write(f"published order {number} as {entry_id}")
            except TRANSIENT_ERRORS as exc:
                self.stderr.write(f"Redis unreachable ({exc}); retrying")
            if stop.wait(1 / rate):
                return
