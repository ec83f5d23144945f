"""The relay: committed outbox rows go to Redis, in id order per (stream, key), then are marked relayed.

One pass (``relay_batch``): claim up to OUTBOX_BATCH waiting rows (on PostgreSQL with ``FOR UPDATE
SKIP LOCKED`` inside a transaction, so several relays take disjoint rows), hold back any row whose
key has an earlier waiting row this relay does not hold (another relay has it, or it is waiting to
be retried), XADD the rest in one pipeline, and mark them relayed in the same transaction.

A relay killed after the XADD and before the commit leaves its rows waiting: the next relay sends
them again. That is at-least-once on purpose; every row carries an id of its own in its fields
(``shoal:idempotency_id``, enqueue.py), so a consumer with ``idempotent="db"`` (or ``"redis"``) makes
one effect of the copies, and one effect of each of the several messages a key may have.

The loop (``run``): a pass whenever a commit nudges (enqueue.nudge: BLPOP on a one-element list),
and at least every OUTBOX_SWEEP_INTERVAL seconds, the sweep that finds rows whose nudge was lost.
Redis away: the pass fails before marking anything, one log line says so, rows accumulate and go
out in order when it is back. A row Redis refuses (the stream key holds another type) is retried
with a growing delay; its error is on the row, in the admin, and it holds back later rows of its key.
"""
import contextlib
import logging
import threading
import time
from datetime import timedelta

import redis
from django.db import DatabaseError, connections, transaction
from django.db.models import Q
from django.utils import timezone

from shoal_common.text import counted, to_text
from streams_app.conf import get_settings
from streams_app.redis.connection import TRANSIENT_ERRORS, dedicated_connection
from streams_app.publishing import scheduled
from streams_app.outbox import cleanup, enqueue
from streams_app.outbox.guard import guard_for

logger = logging.getLogger("streams_app.outbox")

RETRY_DELAY_MAX = 300.0  # seconds: a row Redis keeps refusing is tried at least this often


def target_stream(stream, key):
    """Where a row goes: the stream, or for a partitioned stream the partition a direct ``publish``
    of the same key goes to (streams_app.partitioning.partitions.route), so both land in one partition, in order.
    Outbox rows always have a key, so this never round-robins.
    """
    from streams_app.partitioning import partitions

    if partitions.is_partitioned(stream):
        return partitions.route(stream, key)
    return stream


def retry_delay(attempts):
    return min(2.0 ** (attempts - 1), RETRY_DELAY_MAX)


class Relay:
    def __init__(self, using="default", *, conn=None, config=None, name="Relay"):
        self.using = using
        self.config = config or dict(get_settings())
        self.conn = conn
        self.name = name
        self.stop = threading.Event()
        self.guard = guard_for(using)
        self.relayed = 0  # rows this relay marked relayed since it started
        self.passes = 0
        self.down_since = None
        self._standing_by = False
        self._once = False
        self._last_cleanup = 0.0
        self._unlogged = 0  # rows relayed since the last progress line
        self._last_line = 0.0

    @property
    def redis(self):
        if self.conn is None:
            self.conn = dedicated_connection("shoal-relay")
        return self.conn

    # -- the loop ---------------------------------------------------------------------------

    def run(self, once=False):
        self._once = once
        try:
            while not self.stop.is_set():
                busy = self.tick()
                if once:
                    return
                if not busy:
                    self.wait()
        finally:
            self.guard.release()
            connections[self.using].close()  # this thread's connection (the relay may run in a thread)

    def tick(self):
        """Relay what is waiting, batch after batch; True when a full batch went out (more may wait)."""
        if not self.guard.acquire():
            if not self._standing_by:
                self._standing_by = True
                logger.warning("%s: another relay holds %s; on SQLite one relay runs at a time (PostgreSQL lets "
                               "several share the work). %s", self.name, self.guard.description,
                               "With --once this one relays nothing and exits: that relay sends what waits."
                               if self._once else
                               "This one stands by and takes over if that one stops.")
            return False
        if self._standing_by:
            self._standing_by = False
            logger.warning("%s: took over %s; relaying", self.name, self.guard.description)
        try:
            sent, claimed = self.relay_batch()
            self._cleanup()
            figures = cleanup.update_gauges(self.using)
        except TRANSIENT_ERRORS as exc:
            if self.down_since is None:
                self.down_since = time.monotonic()
                logger.warning("%s: Redis unreachable (%s); outbox rows wait in the database and go out in order "
                               "when it is back. Retrying every %.0fs, quietly.", self.name, exc,
                               self.config["OUTBOX_SWEEP_INTERVAL"])
            return False
        except DatabaseError as exc:
            logger.warning("%s: database error (%s); retrying at the next sweep", self.name, exc)
            # A broken connection (database restarted) is replaced at the next pass, not reused forever.
            connections[self.using].close_if_unusable_or_obsolete()
            return False
        # Only a pass that sent rows has heard from Redis: one that found nothing to claim (another relay
        # holds the rows, none is due) proves nothing, and saying "reachable again" then misleads.
        if self.down_since is not None and claimed:
            logger.warning("%s: Redis reachable again after %.0fs; relaying the backlog", self.name,
                           time.monotonic() - self.down_since)
            self.down_since = None
        self.passes += 1
        self._unlogged += sent
        self._say_progress(figures)
        return sent > 0 and claimed >= self.config["OUTBOX_BATCH"]

    def _say_progress(self, figures):
        """One line for the rows relayed since the last one, at most once per sweep interval: a busy
        site nudges the relay at every commit, a large backlog takes many batches, and an idle relay
        has nothing to say."""
        if self._unlogged and time.monotonic() - self._last_line >= self.config["OUTBOX_SWEEP_INTERVAL"]:
            logger.info("%s: relayed %s to Redis; %s waiting", self.name, counted(self._unlogged, "row"),
                        counted(figures["rows"], "row"))
            self._unlogged = 0
            self._last_line = time.monotonic()

    def wait(self):
        """Until a commit nudges, the sweep interval passes, or the relay is stopped."""
        timeout = self.config["OUTBOX_SWEEP_INTERVAL"]
        if self.down_since is not None or self._standing_by:
            self.stop.wait(timeout)
            return
        try:
            self.redis.blpop([enqueue.NUDGE_KEY], timeout=timeout)
        except TRANSIENT_ERRORS:
            self.stop.wait(timeout)

    # -- one batch ----------------------------------------------------------------------------

    def relay_batch(self):
        """Send and mark one batch; return (rows relayed, rows claimed)."""
        from streams_app.outbox.models import OutboxMessage

        connection = connections[self.using]
        locking = connection.features.has_select_for_update_skip_locked
        now = timezone.now()
        # Without row locks (SQLite, one relay: see guard.py) nothing is gained by holding a write
        # transaction open across the XADDs; the marking below is its own transaction.
        with transaction.atomic(using=self.using) if locking else contextlib.nullcontext():
            rows = list(OutboxMessage.objects.using(self.using).select_for_update(skip_locked=True)
                        .filter(relayed_at__isnull=True)
                        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
                        .order_by("id")[: self.config["OUTBOX_BATCH"]])
            if not rows:
                return 0, 0
            rows = self.in_key_order(rows)
            if not rows:
                return 0, 0
            refused = self._layout_errors({row.stream for row in rows})
            failed = [(row, refused[row.stream]) for row in rows if row.stream in refused]
            rows = [row for row in rows if row.stream not in refused]
            replies = self._send(rows)
            done = []
            for row, reply in zip(rows, replies):
                if isinstance(reply, TRANSIENT_ERRORS):
                    raise reply
                (failed if isinstance(reply, Exception) else done).append((row, reply))
            self._mark(done, failed, now)
        self.relayed += len(done)
        return len(done), len(rows) + len(failed)

    def _layout_errors(self, streams):
        """Stream -> PartitionConfigError for the streams whose declared partitions differ from Redis's
        record: their rows are refused (kept, retried with a growing delay) rather than sent where no
        consumer reads them."""
        from streams_app.partitioning import partitions
        from streams_app.exceptions import PartitionConfigError

        refused = {}
        for stream in sorted(streams):
            try:
                partitions.ensure_recorded(self.redis, stream)
            except PartitionConfigError as exc:
                refused[stream] = exc
        return refused

    def in_key_order(self, rows):
        """``rows`` without those an earlier waiting row of the same stream and key must precede.

        Such a row is not in this batch because another relay holds it (PostgreSQL) or because it
        failed and waits for its retry: either way, sending a later one now would reorder the key.
        """
        from streams_app.outbox.models import OutboxMessage

        ids = {row.id for row in rows}
        earliest = {}
        earlier = (OutboxMessage.objects.using(self.using)
                   .filter(relayed_at__isnull=True, id__lt=max(ids), key__in={row.key for row in rows})
                   .values_list("stream", "key", "id"))
        for stream, key, row_id in earlier:
            if row_id not in ids and row_id < earliest.get((stream, key), row_id + 1):
                earliest[(stream, key)] = row_id
        if not earliest:
            return rows
        return [row for row in rows if earliest.get((row.stream, row.key), row.id + 1) > row.id]

    def _send(self, rows):
        """XADD ``rows`` in one pipeline; a deferred row's message goes to its stream's scheduled set
        instead (streams_app/publishing/scheduled.py, one script per stream). Their replies in order: the entry id
        or scheduled id, or the error Redis gave the row."""
        deferred = [i for i, row in enumerate(rows) if scheduled.RUN_AFTER_FIELD in row.fields]
        direct = [row for row in rows if scheduled.RUN_AFTER_FIELD not in row.fields]
        replies = []
        if direct:
            pipe = self.redis.pipeline(transaction=False)
            for row in direct:
                self._xadd(pipe, row)
            replies = pipe.execute(raise_on_error=False)
        if not deferred:
            return replies
        later = scheduled.schedule_each(self.redis, [(target_stream(rows[i].stream, rows[i].key), rows[i].fields,
                                                      rows[i].maxlen) for i in deferred])
        direct_replies, later = iter(replies), dict(zip(deferred, later))
        return [later[i] if i in later else next(direct_replies) for i in range(len(rows))]

    def _xadd(self, pipe, row):
        stream = target_stream(row.stream, row.key)
        if row.maxlen is None:
            pipe.xadd(stream, row.fields)
        else:
            pipe.xadd(stream, row.fields, maxlen=row.maxlen, approximate=True)

    def _mark(self, done, failed, now):
        from streams_app.outbox.models import OutboxMessage

        manager = OutboxMessage.objects.using(self.using)
        connection = connections[self.using]
        with transaction.atomic(using=self.using):
            if done:
                mark_relayed(connection, now, [(row.id, to_text(entry_id)) for row, entry_id in done])
            for row, exc in failed:
                attempts = row.attempts + 1
                error = describe(exc, row)
                manager.filter(id=row.id).update(attempts=attempts, last_error=error,
                                                 next_attempt_at=now + timedelta(seconds=retry_delay(attempts)))
                if row.attempts == 0:  # once per row: the admin lists the rows that keep failing
                    logger.warning("%s: outbox row %d (%s, key %s) was refused: %s; retried with a growing delay "
                                   "(up to %.0fs), later rows of its key wait", self.name, row.id, row.stream,
                                   row.key, error, RETRY_DELAY_MAX)

    def _cleanup(self):
        if time.monotonic() - self._last_cleanup >= self.config["OUTBOX_SWEEP_INTERVAL"]:
            self._last_cleanup = time.monotonic()
            cleanup.delete_relayed(self.using, self.config["OUTBOX_RETENTION"], self.config["OUTBOX_BATCH"])


def mark_relayed(connection, now, pairs):
    """Set relayed_at and entry_id of the rows ``pairs`` (id, entry id) name, in one round trip.

    Django's bulk_update (a CASE per row) cost the relay two thirds of its time; on PostgreSQL one
    UPDATE joins two arrays, elsewhere (SQLite: no round trips) executemany does.
    """
    from streams_app.outbox.models import OutboxMessage

    table = connection.ops.quote_name(OutboxMessage._meta.db_table)
    when = connection.ops.adapt_datetimefield_value(now)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"UPDATE {table} AS o SET relayed_at = %s, entry_id = d.entry_id "
                           "FROM unnest(%s::bigint[], %s::text[]) AS d(id, entry_id) WHERE o.id = d.id",
                           [when, [i for i, _ in pairs], [e for _, e in pairs]])
        else:
            cursor.executemany(f"UPDATE {table} SET relayed_at = %s, entry_id = %s WHERE id = %s",
                               [(when, entry_id, row_id) for row_id, entry_id in pairs])


def describe(exc, row):
    text = str(exc)
    if isinstance(exc, redis.ResponseError) and text.startswith("WRONGTYPE"):
        return (f"Redis key {row.stream!r} holds another type, not a stream ({text}). Rename or remove that key; "
                "the row is sent when it can be.")
    return f"{type(exc).__name__}: {text}"
