"""Idempotency guards: a duplicate delivery of a handled message is acked without running the handler.

``idempotent="redis"``: before a chunk runs, one pipelined ``SET key running NX GET PX <pending
timeout>`` per message; an existing ``done`` means a duplicate (acked unseen), an existing
``running`` means another consumer is handling the same key right now (the entry fails and is
retried after its back-off). After the chunk, ``done`` is set with IDEMPOTENCY_TTL for successes
and the guard is deleted for failures, so retries run. The running mark expires with the pending
timeout, so a worker killed mid-handler does not block its message forever; a live holder renews it
with the entry's idle time (GroupLoop.keep_alive), so a handler slower than the pending timeout
keeps its mark and is never run a second time next to itself. Two round trips per
chunk; fast, but effects in other systems may still happen twice if a worker dies after them.

``idempotent="db"``: a ProcessedMessage row (unique stream, group, key) is inserted in the same
transaction as the handler's own ORM writes. If the worker dies after the commit and before the
ack, the redelivery finds the row and is acked unseen: the handler's database effects happen
exactly once. A concurrent duplicate waits on the unique index and then finds the row.

The savepoint rule: a database error caught inside the handler without a savepoint of its own
(``try: Tag.objects.create(...) except IntegrityError: pass``) marks the guard's transaction for
rollback, and Django silently rolls everything back when the block ends. The guard checks for that
after the handler returns and fails the message instead of acking work that was never committed;
the handler must put the statement that may fail in its own ``with transaction.atomic():``.
PostgreSQL adds a case Django does not mark: a failed raw-cursor statement or ORM read caught
without a savepoint leaves the transaction aborted (InFailedSqlTransaction) and COMMIT then rolls
back without an error. The guard asks the driver for the transaction status, a local read with no
round trip, and fails the message the same way.
"""
import hashlib

from django.db import IntegrityError, transaction

from shoal_common.text import to_text
from streams_app.redis import keys
from streams_app.publishing.message import IDEMPOTENCY_ID_FIELD

RUNNING = "running"
DONE = "done"


class DuplicateInFlight(Exception):
    """Another consumer is handling a message with the same key right now."""


class TransactionRolledBack(Exception):
    """The handler returned, but its transaction (idempotent="db") was marked for rollback: nothing committed."""


ROLLED_BACK = ("the handler returned, but its database transaction was marked for rollback, so nothing it wrote "
               "was committed and the message is not acknowledged. A database error was caught inside the "
               "handler (e.g. IntegrityError in try/except) with no savepoint around the statement that failed. "
               "Wrap that statement in its own `with transaction.atomic():` inside the try, as Django documents "
               "(idempotent=\"db\" runs the handler in one transaction).")
ABORTED = ("the handler returned, but PostgreSQL had aborted its database transaction, so nothing it wrote "
           "was committed (COMMIT rolls an aborted transaction back) and the message is not acknowledged. "
           "A database error (from a raw cursor, or an ORM read) was caught inside the handler with no "
           "savepoint around the statement that failed. Wrap that statement in its own "
           "`with transaction.atomic():` inside the try, as Django documents "
           "(idempotent=\"db\" runs the handler in one transaction).")


def transaction_aborted(connection):
    """True when the server has aborted the open transaction (PostgreSQL's "in failed transaction")."""
    if connection.vendor != "postgresql" or connection.connection is None:
        return False
    raw = connection.connection
    info = getattr(raw, "info", None)
    if info is not None and hasattr(info, "transaction_status"):  # psycopg 3
        from psycopg.pq import TransactionStatus

        return info.transaction_status == TransactionStatus.INERROR
    get_status = getattr(raw, "get_transaction_status", None)  # psycopg2
    if get_status is not None:
        from psycopg2.extensions import TRANSACTION_STATUS_INERROR

        return get_status() == TRANSACTION_STATUS_INERROR
    return False


_IDEMPOTENCY_ID = IDEMPOTENCY_ID_FIELD.encode()
# Longer keys are stored hashed: the Redis key and ProcessedMessage.key (255) stay bounded.
KEY_MAX = 200


def guard_key(raw):
    """The stored form of an idempotency key given as the bytes Redis holds (both guards use it).

    UTF-8 text up to KEY_MAX characters without NUL is stored as it is, as it always was: the marks and
    rows of a running deployment still match after an upgrade. Anything else is stored as
    ``sha256:<hex>`` of the bytes: longer keys (bounded), NUL (PostgreSQL text refuses it: the guard's
    insert would fail on every delivery) and bytes that are not UTF-8, which foreign producers may XADD.
    Decoded with U+FFFD, ``a\\xff``, ``a\\xfe`` and ``a\\ufffd`` were one key and the later ones were
    acked unrun; hashing the bytes keeps distinct bytes distinct and the same bytes the same key.
    """
    try:
        key = raw.decode("utf-8")
    except UnicodeDecodeError:
        key = None
    if key is None or len(key) > KEY_MAX or "\x00" in key:
        return "sha256:" + hashlib.sha256(raw).hexdigest()
    return key


def message_key(message):
    """The guard key of ``message``: its outbox id first (its key orders and routes, and many messages
    may share it), else its key, else its entry id."""
    raw = message.field_bytes(_IDEMPOTENCY_ID) or message.field_bytes(b"key") or message.id.encode()
    return guard_key(raw)


class RedisGuard:
    # Consumers the read loop has found dead (streams_app.consuming.loop._claim_from_dead); their marks
    # are leftovers. Replaced, never mutated, so handler threads read it without a lock.
    confirmed_dead = frozenset()

    def __init__(self, conn, stream, group, running_ms, ttl):
        self.conn = conn
        self.stream = stream
        self.group = group
        self.running_ms = running_ms
        self.ttl = ttl

    def mark_key(self, message):
        return keys.idempotency_key(self.stream, self.group, message_key(message))

    _key = mark_key

    def begin(self, messages):
        """Split into (to run, duplicates to ack, [(message, DuplicateInFlight)])."""
        pipe = self.conn.pipeline(transaction=False)
        for message in messages:
            pipe.set(self._key(message), f"{RUNNING}:{message.consumer}:{message.id}", nx=True, get=True, px=self.running_ms)
        to_run, duplicates, busy = [], [], []
        mine = []
        for message, previous in zip(messages, pipe.execute()):
            previous = to_text(previous)
            if previous is None:
                to_run.append(message)
            elif previous == DONE:
                duplicates.append(message)
            elif self._left_over(previous, message):
                # A mark for this very entry, left by this consumer (a chunk handed back, a failed
                # "done" write) or by a consumer known dead: nobody else is running it.
                to_run.append(message)
                mine.append(message)
            else:
                busy.append((message, DuplicateInFlight(f"key {message_key(message)!r} is being handled by {previous.split(':', 1)[-1]}")))
        if mine:
            pipe = self.conn.pipeline(transaction=False)
            for message in mine:
                pipe.set(self._key(message), f"{RUNNING}:{message.consumer}:{message.id}", px=self.running_ms)
            pipe.execute()
        return to_run, duplicates, busy

    def _left_over(self, mark, message):
        prefix, _, entry_id = mark.rpartition(":")
        holder = prefix.partition(":")[2]
        return entry_id == message.id and (holder == message.consumer or holder in self.confirmed_dead)

    def call(self, handler, message):
        handler(message)
        return True

    def end(self, succeeded, failed):
        if not succeeded and not failed:
            return
        pipe = self.conn.pipeline(transaction=False)
        for message in succeeded:
            pipe.set(self._key(message), DONE, ex=self.ttl)
        for message in failed:
            pipe.delete(self._key(message))
        pipe.execute()


class DbGuard:
    def begin(self, messages):
        return messages, [], []

    def call(self, handler, message):
        """Run ``handler`` in a transaction with the ProcessedMessage row; False for a duplicate."""
        from streams_app.models import ProcessedMessage

        with transaction.atomic():
            try:
                with transaction.atomic():
                    ProcessedMessage.objects.create(
                        stream=message.stream, group=message.group, key=message_key(message), entry_id=message.id,
                    )
            except IntegrityError:
                return False
            handler(message)
            if transaction.get_rollback():
                # Leaving the block would roll back silently and we would ack: zero times, not once.
                raise TransactionRolledBack(ROLLED_BACK)
            if transaction_aborted(transaction.get_connection()):
                raise TransactionRolledBack(ABORTED)
        return True

    def end(self, succeeded, failed):
        pass


def make_guard(spec, conn, config):
    if spec.idempotent == "redis":
        return RedisGuard(conn, spec.stream, spec.group, config["PENDING_TIMEOUT_MS"], config["IDEMPOTENCY_TTL"])
    if spec.idempotent == "db":
        return DbGuard()
    return None
