"""Building messages as a consumer receives them, without Redis: ``make_message`` for handler unit tests."""
from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from streams_app.publishing.message import Message
from streams_app.redis.names import validate_stream_name
from streams_app.publishing.encoding import encode_message

# A Redis stream entry id: <milliseconds>-<sequence>, both whole numbers; 0-0 is the one Redis never gives.
_ENTRY_ID = re.compile(r"[0-9]+-[0-9]+")

_lock = threading.Lock()
_sequence = itertools.count(1)
_last = [0, 0]  # (ms, seq) of the last id made: ids only grow, as a stream's do


def new_entry_id() -> str:
    """An entry id in Redis's form (``<ms>-<seq>``), greater than every id made before in this process."""
    with _lock:
        ms = max(int(time.time() * 1000), _last[0])
        seq = _last[1] + 1 if ms == _last[0] else 0
        _last[:] = [ms, seq]
    return f"{ms}-{seq}"


def as_stored(fields: Mapping[str, Any]) -> dict[bytes, bytes]:
    """Encoded fields as a consumer's XREADGROUP returns them: bytes names and values."""
    return {name.encode(): value if isinstance(value, bytes) else str(value).encode() for name, value in fields.items()}


def make_message(payload: Any = None, *, stream: str = "test", group: str = "test", id: str | None = None,
                 key: str | None = None, headers: dict[str, Any] | None = None, deliveries: int = 1,
                 codec: str | None = None, fields: Mapping[str, str | bytes] | None = None) -> Message:
    """A Message as the handler of ``stream``/``group`` receives it, encoded exactly as ``publish`` encodes.

    ``payload``, ``key``, ``headers`` and ``codec`` are ``publish()``'s (bad input raises the same
    PublishError); datetimes, Decimals and UUIDs come back typed, as in production. ``stream`` is checked
    as ``publish`` checks it (PublishError). ``id`` defaults to a fresh entry id (given, it must look like
    one: ``<ms>-<seq>``, ValueError otherwise); ``deliveries`` is the delivery count the handler sees (1
    on the first delivery; below 1 is a ValueError).
    ``fields`` adds or replaces raw entry fields after encoding, e.g. ``fields={"payload": "{not json"}``
    for a poison message.
    """
    validate_stream_name(stream)  # as publish() does: PublishError
    if id is not None and (not isinstance(id, str) or not _ENTRY_ID.fullmatch(id) or id == "0-0"):
        raise ValueError(f"id must be an entry id like '1700000000000-0' (<ms>-<seq>, above 0-0), not {id!r}")
    if type(deliveries) is not int or deliveries < 1:
        raise ValueError(f"deliveries must be a whole number, 1 or more (1 is the first delivery), not {deliveries!r}")
    entry: dict[str, Any] = dict(encode_message(payload, key=key, headers=headers, codec=codec))
    if fields:
        entry.update(fields)
    return Message(id or new_entry_id(), stream, group, as_stored(entry), deliveries=deliveries, consumer="testing")
