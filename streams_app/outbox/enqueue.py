"""Writing outbox rows: ``publish(..., outbox=True)`` and ``publish_many(..., outbox=True)`` land here.

The row is written with the caller's connection (``using``) inside the caller's transaction, so it
commits or rolls back with the caller's own writes. Outside a transaction, ``atomic`` makes the
insert its own tiny transaction. After the commit, ``on_commit`` nudges the relay (a one-element
Redis list it waits on); if the nudge fails, nothing is lost: the relay's sweep finds the row.
"""
import logging
import uuid

from django.db import transaction

from streams_app.connection import TRANSIENT_ERRORS, get_connection
from streams_app.exceptions import PublishError

logger = logging.getLogger("streams_app.outbox")

NUDGE_KEY = "shoal:outbox:nudge"  # a spurious wake-up is harmless, so deployments may share it
KEY_MAX = 255  # OutboxMessage.key


def new_key():
    """A key for a message published without one: the consumer's guard needs one that a re-send repeats."""
    return f"outbox-{uuid.uuid4().hex}"


def check_key(key):
    if key is None:
        return new_key()
    if not isinstance(key, str) or not key:
        raise PublishError(f"key must be a non-empty string, not {key!r}")
    if len(key) > KEY_MAX:
        raise PublishError(f"an outbox message key is at most {KEY_MAX} characters, not {len(key)}")
    return key


def enqueue(stream, encoded, keys, maxlen, using):
    """Write one row per message (``encoded``: the fields from producer.encode_message); return the keys."""
    from streams_app.outbox.models import OutboxMessage

    # The codec may write bytes (orjson: UTF-8); the row stores text, which XADD sends as the same bytes.
    rows = [OutboxMessage(stream=stream, key=key, fields={name: _text(value) for name, value in fields.items()},
                          maxlen=maxlen) for key, fields in zip(keys, encoded)]
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


def nudge():
    """Wake a waiting relay now rather than at its next sweep. Never raises: it runs after the caller's commit."""
    try:
        pipe = get_connection().pipeline(transaction=False)
        pipe.lpush(NUDGE_KEY, 1)
        pipe.ltrim(NUDGE_KEY, 0, 0)  # one pending nudge is as good as many
        pipe.execute()
    except TRANSIENT_ERRORS as exc:
        logger.debug("Outbox: could not nudge the relay (%s); its sweep will find the rows", exc)
    except Exception:  # the caller's transaction is committed: an error here must not look like a failed write
        logger.exception("Outbox: could not nudge the relay; its sweep will find the rows")
