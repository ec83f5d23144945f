import json
import sys

from django.core.management.base import BaseCommand, CommandError

from streams_app.connection import TRANSIENT_ERRORS
from streams_app.exceptions import PublishError
from streams_app.producer import publish, publish_many


class Command(BaseCommand):
    help = "Publish a JSON message to a stream, or one message per line of stdin with '-'. Prints the entry ids."

    def add_arguments(self, parser):
        parser.add_argument("stream", help="Stream name, e.g. orders.")
        parser.add_argument("payload", metavar="JSON", nargs="?", default="-", help="The JSON payload, or '-' (the default) to read one per line from stdin.")
        parser.add_argument("--key", help="Idempotency key of the message (single message only).")
        parser.add_argument("--headers", help="JSON object of headers for every message.")
        parser.add_argument("--maxlen", type=int, help="Cap the stream at about this many entries (MAXLEN ~; drops old entries read or not).")

    def handle(self, *args, stream, payload, key, headers, maxlen, **options):
        header_dict = self._parse_headers(headers)
        try:
            if payload != "-":
                ids = [publish(stream, self._parse(payload, "the JSON argument"), key=key, headers=header_dict, maxlen=maxlen)]
            else:
                if key is not None:
                    raise CommandError("--key names a single message; it cannot be used with '-' (many messages).")
                payloads = [
                    self._parse(line, f"line {number} of stdin")
                    for number, line in enumerate(sys.stdin, start=1)
                    if line.strip()
                ]
                if not payloads:
                    raise CommandError("stdin had no messages; give one JSON document per line.")
                ids = publish_many(stream, payloads, headers=header_dict, maxlen=maxlen)
        except PublishError as exc:
            raise CommandError(f"nothing was published: {exc}") from None
        except TRANSIENT_ERRORS as exc:
            raise CommandError(f"nothing was published: Redis is unreachable ({exc}). Check REDIS_URL.") from None
        for entry_id in ids:
            self.stdout.write(entry_id)

    def _parse(self, text, where):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise CommandError(f"{where} is not valid JSON ({exc}); nothing was published.") from None

    def _parse_headers(self, text):
        if text is None:
            return None
        value = self._parse(text, "--headers")
        if not isinstance(value, dict):
            raise CommandError("--headers must be a JSON object, e.g. '{\"trace\": \"abc\"}'.")
        return value

