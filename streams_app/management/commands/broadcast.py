import json
import time
import uuid

from django.core.management.base import CommandError

from shoal_common.cli import ShoalCommand

from streams_app.broadcast import VALIDATORS, broadcast, handlers_for
from streams_app.redis.connection import TRANSIENT_ERRORS, get_connection
from streams_app.exceptions import BroadcastError


class Command(ShoalCommand):
    help = ("Send a broadcast that every listening Shoal process receives (gunicorn workers, consumers). "
            "Built-in types: ping, log_level, discovery.invalidate.")

    def add_arguments(self, parser):
        parser.add_argument("type", help="Broadcast type, e.g. log_level or ping.")
        parser.add_argument("data", metavar="JSON", nargs="?", help='Data for the handlers, e.g. \'{"level": "DEBUG"}\'.')
        parser.add_argument("--wait", type=float, default=1.0,
                            help="ping only: seconds to collect replies before listing them (default 1).")

    def handle(self, *args, type, data, wait, **options):
        payload = self._parse(data)
        try:
            if type in VALIDATORS:
                VALIDATORS[type](payload)
        except BroadcastError as exc:
            raise CommandError(f"nothing was sent: {exc}") from None
        if type == "ping":
            if wait <= 0:
                raise CommandError("--wait must be above 0 seconds for a ping to collect replies.")
            payload = {**(payload or {}), "reply_to": f"shoal:broadcast:ping:{uuid.uuid4().hex}"}
        elif not handlers_for(type):
            self.stderr.write(self.style.WARNING(
                f"no handler for {type!r} is registered in this process; processes without one ignore it."))
        try:
            receivers = broadcast(type, payload)
            self.stdout.write(self.style.SUCCESS(f"{type}: delivered to {receivers} listening process(es)."))
            if type == "ping":
                self._list_replies(payload["reply_to"], receivers, wait)
        except BroadcastError as exc:
            raise CommandError(f"nothing was sent: {exc}") from None
        except TRANSIENT_ERRORS as exc:
            raise CommandError(f"nothing was sent: Redis is unreachable ({exc}). Check REDIS_URL.") from None

    def _parse(self, text):
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise CommandError(f"JSON is not valid ({exc}); nothing was sent.") from None

    def _list_replies(self, key, expected, wait):
        conn = get_connection()
        deadline = time.monotonic() + wait
        while conn.hlen(key) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        replies = sorted((json.loads(v) for v in conn.hgetall(key).values()), key=lambda r: (r["host"], r["pid"]))
        for reply in replies:
            self.stdout.write(f"  {reply['host']} pid {reply['pid']} (parent {reply['ppid']})")
        self.stdout.write(f"{len(replies)} of {expected} replied within {wait:g}s.")
