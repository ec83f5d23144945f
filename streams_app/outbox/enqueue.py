"""Writing outbox rows: ``publish(..., outbox=True)`` and ``publish_many(..., outbox=True)`` land here.

The row is written with the caller's connection (``using``) inside the caller's transaction, so it
commits or rolls back with the caller's own writes. Outside a transaction, ``atomic`` makes the
insert its own tiny transaction. After the commit, ``on_commit`` nudges the relay (a one-element
Redis list it waits on); if the nudge fails, nothing is lost: the relay's sweep finds the row.
"""
import logging
import time
import uuid

from django.db import transaction

from streams_app.conf import setting
from shoal_common.page_redis import short_timeout_client
from streams_app.redis.connection import TRANSIENT_ERRORS, get_connection
from streams_app.exceptions import PublishError
from streams_app.publishing.message import IDEMPOTENCY_ID_FIELD

logger = logging.getLogger("streams_app.outbox")

NUDGE_KEY = "shoal:outbox:nudge"  # a spurious wake-up is harmless, so deployments may share it
KEY_MAX = 255  # OutboxMessage.key
STREAM_MAX = 200  # OutboxMessage.stream
MAXLEN_MAX = 2**63 - 1  # OutboxMessage.maxlen, a 64-bit integer column


def new_key():
    """A key for a message published without one: the partitioned streams route by it."""
    return f"outbox-{uuid.uuid4().hex}"


def new_idempotency_id():
    """This row's own id, sent with every copy the relay sends, so the consumers' guards make one effect of them."""
    return f"outbox-{uuid.uuid4().hex}"


# A value the database refuses would fail inside the caller's transaction and break it (PostgreSQL
# has no NUL in text; every database has its column sizes): such input is refused before any SQL.

def check_key(key):
    if key is None:
        return new_key()
    if not isinstance(key, str) or not key:
        raise PublishError(f"key must be a non-empty string, not {key!r}")
    if len(key) > KEY_MAX:
        raise PublishError(f"an outbox message key is at most {KEY_MAX} characters, not {len(key)}")
    _no_nul(key, "an outbox message key")
    return key


def check_row(stream, maxlen):
    if len(stream) > STREAM_MAX:
        raise PublishError(f"an outbox stream name is at most {STREAM_MAX} characters, not {len(stream)}")
    _no_nul(stream, "an outbox stream name")
    if maxlen is not None and maxlen > MAXLEN_MAX:
        raise PublishError(f"maxlen is at most {MAXLEN_MAX}, not {maxlen}")


NUL = "\x00"


def _no_nul(text, what):
    if NUL in text:
        raise PublishError(f"{what} must not contain a NUL character (\\x00, at position {text.index(NUL)}): "
                           "databases such as PostgreSQL cannot store it in text")


def enqueue(stream, encoded, keys, maxlen, using):
    """Write one row per message (``encoded``: the fields from encoding.encode_message); return the keys."""
    from streams_app.outbox.models import OutboxMessage

    # The codec may write bytes (orjson: UTF-8); the row stores text, which XADD sends as the same bytes.
    rows = [OutboxMessage(stream=stream, key=key, maxlen=maxlen, fields={
        **{name: _text(value) for name, value in fields.items()}, IDEMPOTENCY_ID_FIELD: new_idempotency_id()})
        for key, fields in zip(keys, encoded)]
    # savepoint=False: inside the caller's transaction this adds nothing; outside, it is the transaction.
    with transaction.atomic(using=using, savepoint=False):
        if len(rows) == 1:
            rows[0].save(using=using, force_insert=True)
        else:
            OutboxMessage.objects.using(using).bulk_create(rows, batch_size=500)
        transaction.on_commit(nudge, using=using)
    return keys


def _text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else value


# After a failed nudge, commits skip the nudge for a sweep interval: with Redis away each attempt costs
# the writer connection retries (up to SOCKET_CONNECT_TIMEOUT when its host does not answer), and the
# relay cannot use a nudge then anyway; its sweep finds the rows.
_quiet_until = 0.0

# The nudge is best-effort and runs inside the writer's request after its commit: a frozen Redis must
# cost it a moment, not the shared pool's timeouts (a trial measured 5 s commits every ~7 s).
NUDGE_TIMEOUT = 0.5


def nudge():
    """Wake a waiting relay now rather than at its next sweep. Never raises: it runs after the caller's commit."""
    global _quiet_until
    if time.monotonic() < _quiet_until:
        return
    try:
        pipe = short_timeout_client(get_connection(), NUDGE_TIMEOUT).pipeline(transaction=False)
        pipe.lpush(NUDGE_KEY, 1)
        pipe.ltrim(NUDGE_KEY, 0, 0)  # one pending nudge is as good as many
        pipe.execute()
    except TRANSIENT_ERRORS as exc:
        _quiet_until = time.monotonic() + setting("OUTBOX_SWEEP_INTERVAL")
        logger.debug("Outbox: could not nudge the relay (%s); its sweep will find the rows", exc)
    except Exception:  # the caller's transaction is committed: an error here must not look like a failed write
        logger.exception("Outbox: could not nudge the relay; its sweep will find the rows")
