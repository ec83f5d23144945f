"""Web-like writers for the outbox tests: each order is an Order row and an outbox publish in one transaction.

``outbox_orders NAME[:rollback] ...``: one transaction per name, in order; ``:rollback`` rolls that
one back after the publish. ``--count N --prefix P --rollback-every K``: N orders P0, P1, ... of
which every K-th is rolled back (the chaos run). Each message's payload carries the order name and
``seq``, the order's position among the messages of the same key (``--keys``, default the name itself).
``--delay S`` defers every message S seconds (``run_after``).
"""
from datetime import timedelta

from django.core.management.base import BaseCommand
from django.db import transaction

from streams_app import publish
from tests.testapp.models import Order

STREAM = "outbox-orders"


class Command(BaseCommand):
    def add_arguments(self, parser):
        parser.add_argument("orders", nargs="*")
        parser.add_argument("--keys", type=int, default=0,
                            help="Spread the orders over this many keys (k0, k1, ...) round robin; 0: key = name.")
        parser.add_argument("--count", type=int, default=0)
        parser.add_argument("--prefix", default="o")
        parser.add_argument("--rollback-every", type=int, default=0)
        parser.add_argument("--delay", type=float, help="Defer each message this many seconds (run_after=).")

    def handle(self, *args, orders, keys, count, prefix, rollback_every, delay, **options):
        run_after = None if delay is None else timedelta(seconds=delay)
        every = rollback_every
        orders = [*orders, *(f"{prefix}{n}{':rollback' if every and n % every == every - 1 else ''}" for n in range(count))]
        seq = {}
        for index, spec in enumerate(orders):
            name, _, fate = spec.partition(":")
            key = f"k{index % keys}" if keys else name
            seq[key] = seq.get(key, -1) + 1
            with transaction.atomic():
                Order.objects.create(name=name)
                publish(STREAM, {"order": name, "seq": seq[key]}, key=key, outbox=True, run_after=run_after)
                if fate == "rollback":
                    transaction.set_rollback(True)
        self.stdout.write(f"wrote {len(orders)} orders")
