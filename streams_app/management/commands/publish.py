import json
import math
import sys
from datetime import datetime, timedelta

import redis

from django.core.management.base import CommandError

from shoal_common.cli import ShoalCommand

from streams_app.redis.connection import TRANSIENT_ERRORS
from streams_app.exceptions import PartialPublishError, PartitionConfigError, PublishError
from streams_app.publishing.producer import publish, publish_many


class Command(ShoalCommand):
    help = ("Publish a JSON message to a stream, or one message per line of stdin with '-'. Prints the entry ids "
            "(with --delay or --run-after: the scheduled ids of the deferred messages).")

    def add_arguments(self, parser):
        parser.add_argument("stream", help="Stream name, e.g. orders.")
        parser.add_argument("payload", metavar="JSON", nargs="?", default="-", help="The JSON payload, or '-' (the default) to read one per line from stdin.")
        parser.add_argument("--key", help="Idempotency key of the message (single message only).")
        parser.add_argument("--headers", help="JSON object of headers for every message.")
        parser.add_argument("--maxlen", type=int, help="Cap the stream at about this many entries (MAXLEN ~; drops old entries read or not).")
        parser.add_argument("--delay", metavar="SECONDS",
                            help="Defer the messages: they reach the stream this many seconds from now (e.g. 300), "
                                 "and the scheduled ids are printed.")
        parser.add_argument("--run-after", metavar="TIME",
                            help="Defer the messages until this ISO 8601 time with its UTC offset "
                                 "(e.g. 2030-01-01T09:00:00+01:00 or ...Z); the scheduled ids are printed.")

    def handle(self, *args, stream, payload, key, headers, maxlen, delay, run_after, **options):
        header_dict = self._parse_headers(headers)
        when = self._when(delay, run_after)
        try:
            if payload != "-":
                ids = [publish(stream, self._parse(payload, "the JSON argument"), key=key, headers=header_dict, maxlen=maxlen,
                               run_after=when)]
            else:
                if key is not None:
                    raise CommandError("--key names a single message; it cannot be used with '-' (many messages).")
                ids = self._publish_lines(stream, header_dict, maxlen, when)
        except (PublishError, PartitionConfigError) as exc:
            raise CommandError(f"nothing was published: {exc}") from None
        except TRANSIENT_ERRORS as exc:
            raise CommandError(f"nothing was published: Redis is unreachable ({exc}). Check REDIS_URL.") from None
        except redis.ResponseError as exc:
            raise CommandError(f"nothing was published: Redis refused the message ({type(exc).__name__}: {exc}).") from None
        for entry_id in ids:
            self.stdout.write(entry_id)

    def _when(self, delay, run_after):
        """The run_after of --delay / --run-after (None: publish now)."""
        if delay is not None and run_after is not None:
            raise CommandError("give --delay or --run-after, not both.")
        if delay is not None:
            try:
                seconds = float(delay)
            except ValueError:
                seconds = None
            if seconds is None or not math.isfinite(seconds) or seconds < 0:
                raise CommandError(f"--delay must be a number of seconds, 0 or more, not {delay!r}; nothing was published.")
            try:
                return timedelta(seconds=seconds)
            except OverflowError:
                raise CommandError(f"--delay {delay} is beyond STREAMS['RUN_AFTER_MAX']; nothing was published.") from None
        if run_after is not None:
            try:
                when = datetime.fromisoformat(run_after)
            except ValueError:
                when = None
            if when is None or when.utcoffset() is None:
                raise CommandError(f"--run-after must be an ISO 8601 time with its UTC offset, e.g. "
                                   f"2030-01-01T09:00:00+01:00 or 2030-01-01T08:00:00Z, not {run_after!r}; nothing "
                                   "was published.")
            return when
        return None

    def _publish_lines(self, stream, header_dict, maxlen, when=None):
        """One message per non-blank line of stdin; errors name the line as the input numbers it."""
        # Bytes, decoded here: the locale's decoding would hide bad bytes behind "not valid JSON".
        source = getattr(sys.stdin, "buffer", sys.stdin)
        numbered = [(number, self._parse(self._utf8(line, number), f"line {number} of stdin"))
                    for number, line in enumerate(source, start=1) if line.strip()]
        if not numbered:
            raise CommandError("stdin had no messages; give one JSON document per line.")
        lines = [number for number, _ in numbered]
        try:
            return publish_many(stream, [payload for _, payload in numbered], headers=header_dict, maxlen=maxlen,
                                run_after=when)
        except PartialPublishError as exc:
            raise self._partial(stream, exc, lines) from None
        except PublishError as exc:
            if getattr(exc, "index", None) is None:
                raise
            raise PublishError(f"line {lines[exc.index]}: {exc.reason}") from None

    def _partial(self, stream, exc, lines):
        """What was published, what may have been, and how to resume without duplicates."""
        for entry_id in exc.ids:  # the ids of what was stored, as a complete run prints them
            self.stdout.write(entry_id)
        done, total = len(exc.ids), len(lines)
        cause = f"Redis failed ({type(exc.cause).__name__}: {exc.cause})"
        if not done and not exc.in_doubt:
            return CommandError(f"nothing was published: {cause}.")
        parts = [f"{cause} after it published {done} of {total} messages"]
        if done:
            parts[0] += f" (lines 1-{lines[done - 1]}), last id {exc.ids[-1]} (printed above)"
        resume_line = lines[done]
        if exc.in_doubt:
            last_doubt = lines[done + exc.in_doubt - 1]
            after = f"({exc.ids[-1]}" if done else "-"
            parts.append(f"lines {resume_line}-{last_doubt} may or may not have been stored (the connection broke while "
                         f"they were sent; check with XRANGE {stream} {after} +)")
            if done + exc.in_doubt < total:
                parts.append(f"nothing after line {last_doubt} was published")
            parts.append(f"to resume: tail -n +{resume_line} FILE | python manage.py publish {stream} - "
                         f"(from line {last_doubt + 1} if those were stored)")
        else:
            parts.append(f"nothing from line {resume_line} on was published")
            parts.append(f"to resume: tail -n +{resume_line} FILE | python manage.py publish {stream} -")
        return CommandError("; ".join(parts) + ".")

    def _utf8(self, line, number):
        try:
            return line.decode("utf-8") if isinstance(line, bytes) else line.encode("utf-8").decode("utf-8")
        except UnicodeError as exc:
            bad = exc.object[exc.start:exc.end]
            shown = bad.hex(" ") if isinstance(bad, bytes) else repr(bad)
            raise CommandError(f"line {number} of stdin is not valid UTF-8 (bytes {shown} at position {exc.start}); "
                               "nothing was published. Convert the input to UTF-8, e.g. with iconv -t UTF-8.") from None

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

