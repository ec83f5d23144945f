"""What a handler receives: one stream entry, decoded.

Built once per entry on the hot path, so it is a slotted class that decodes lazily: the payload
once (``decode()`` runs before the handler), the other fields only when asked for.
"""
from __future__ import annotations

import json
from typing import Any

from shoal_common.text import to_text
from streams_app.publishing import codec
from streams_app.exceptions import PayloadDecodeError

PAYLOAD_FIELDS = (b"payload", b"data")  # older producers publish under "data"; both are read.

_UNSET = object()
# Reserved by Shoal (streams_app.deadletters.store.RESERVED_FIELDS): set on replayed dead letters.
TARGET_GROUP_FIELD = b"shoal:target_group"
# Set by the outbox (streams_app/outbox/enqueue.py): one per outbox row, repeated when the relay re-sends
# it. The idempotency guards prefer it to ``key``, which many messages may share (key=f"order-{pk}").
IDEMPOTENCY_ID_FIELD = "shoal:idempotency_id"
_IDEMPOTENCY_ID_RAW = IDEMPOTENCY_ID_FIELD.encode()
# Set on a deferred message when it is moved onto its stream (streams_app/publishing/scheduled.py): the scheduled id
# ``publish(..., run_after=...)`` returned, and when it was due (ms since the epoch, on the Redis clock).
SCHEDULED_ID_FIELD = "shoal:scheduled_id"
RUN_AFTER_FIELD = "shoal:run_after"


def _text(value: Any) -> str:
    return str(to_text(value, errors="replace"))


def decode_fields(raw: dict[Any, Any]) -> dict[str, str]:
    """Entry fields as ``str -> str``; bytes that are not UTF-8 are kept visible with U+FFFD."""
    return {_text(k): _text(v) for k, v in raw.items()}


_TEXT_NAMES: dict[bytes, str] = {}  # field name (bytes) -> the same as str, made once: _raw misses on every entry


def _raw(fields: dict[Any, Any], name: bytes) -> Any:
    value = fields.get(name)
    if value is None:  # absent, or a client built with decode_responses=True
        text = _TEXT_NAMES.get(name)
        if text is None:
            text = _TEXT_NAMES[name] = name.decode()
        value = fields.get(text)
    return value


class Message:
    """One stream entry as its handler receives it.

    ``id``: the entry id, ``"<ms>-<seq>"``; ``stream``: the stream it was read from; ``group``: the consumer group
    it was delivered to (None for one only read, as streams_app.testing captures); ``deliveries``: 1 on the first
    delivery, more on a retry; ``consumer``: the consumer that read it; ``raw_fields``: the entry's fields as
    Redis returned them (bytes). ``payload`` and ``headers`` are decoded once, before the handler runs.
    """

    __slots__ = ("id", "stream", "group", "raw_fields", "deliveries", "consumer", "_payload", "_headers", "_fields")

    id: str  # the entry id, "<ms>-<seq>"
    stream: str
    group: str | None  # the consumer group it was delivered to (None for one only read, as streams_app.testing captures)
    raw_fields: dict[Any, Any]  # the entry's fields as Redis returned them (bytes)
    deliveries: int  # 1 on the first delivery
    consumer: str

    def __init__(self, id: str, stream: str, group: str | None, raw_fields: dict[Any, Any], deliveries: int = 1,
                 consumer: str = "") -> None:
        self.id = id
        self.stream = stream
        self.group = group
        self.raw_fields = raw_fields
        self.deliveries = deliveries
        self.consumer = consumer
        self._payload: Any = _UNSET
        self._headers: Any = _UNSET
        self._fields: dict[str, str] | None = None

    def __repr__(self) -> str:
        return f"<Message {self.stream} {self.id} group={self.group} deliveries={self.deliveries}>"

    def decode(self) -> None:
        """Decode payload and headers now; raises PayloadDecodeError for poison input."""
        _ = self.payload, self.headers  # both are decoding properties

    @property
    def payload(self) -> Any:
        """The decoded JSON payload. Raises PayloadDecodeError for poison input."""
        if self._payload is _UNSET:
            fields = self.raw_fields
            raw = fields.get(b"payload")
            if raw is not None:  # the hot path: Shoal's field, a bytes client
                # Only payloads holding datetimes, Decimals... carry payload_types (streams_app/publishing/codec.py).
                types = fields.get(b"payload_types")
            else:
                raw, types = self._other_payload_fields()
            self._payload = codec.decode(raw, types, entry_id=self.id)
        return self._payload

    def _other_payload_fields(self) -> tuple[Any, Any]:
        """(payload, payload_types) of a decoded client's entry, or of an older producer's ``data``."""
        for name in PAYLOAD_FIELDS:
            raw = _raw(self.raw_fields, name)
            if raw is not None:
                return raw, (_raw(self.raw_fields, b"payload_types") if name == b"payload" else None)
        raise PayloadDecodeError(f"entry {self.id} has no 'payload' or 'data' field")

    @property
    def headers(self) -> dict[str, Any]:
        """The decoded headers published with the message (``publish(..., headers=)``); {} when there were none."""
        if self._headers is _UNSET:
            raw = _raw(self.raw_fields, b"headers")
            if raw is None:
                self._headers = {}
            else:
                try:
                    headers = json.loads(raw)
                except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                    raise PayloadDecodeError(f"entry {self.id}: headers are not valid JSON ({exc!r})") from None
                if not isinstance(headers, dict):
                    raise PayloadDecodeError(f"entry {self.id}: headers must be a JSON object")
                self._headers = headers
        return self._headers

    @property
    def fields(self) -> dict[str, str]:
        """Every field of the entry as text, undecoded JSON included."""
        fields = self._fields
        if fields is None:
            fields = self._fields = decode_fields(self.raw_fields)
        return fields

    @property
    def target_group(self) -> str | None:
        """Set on replayed dead letters: only this group handles the entry; others ack it unseen."""
        raw = _raw(self.raw_fields, TARGET_GROUP_FIELD)
        if raw is None and _raw(self.raw_fields, b"replay_of") is not None:
            # Replayed before Shoal namespaced its fields (both bare names together: not a producer's).
            raw = _raw(self.raw_fields, b"target_group")
        return None if raw is None else _text(raw)

    @property
    def idempotency_id(self) -> str | None:
        """What the idempotency guards deduplicate by when set (outbox messages): see IDEMPOTENCY_ID_FIELD."""
        raw = _raw(self.raw_fields, _IDEMPOTENCY_ID_RAW)
        return None if raw is None else _text(raw)

    def field_bytes(self, name: bytes) -> bytes | None:
        """The value of the field ``name`` as the bytes Redis holds, or None when absent.

        What the idempotency guards key by: the text properties show bytes that are not UTF-8 as
        U+FFFD, so ``a\\xff`` and ``a\\xfe`` would read as one key. A decoded client's str (strictly
        decoded: valid UTF-8) gives its UTF-8 back; "surrogatepass" only keeps distinct strs distinct.
        """
        raw = _raw(self.raw_fields, name)
        if raw is None or type(raw) is bytes:
            return raw
        return str(raw).encode("utf-8", "surrogatepass")

    @property
    def scheduled_id(self) -> str | None:
        """A deferred message's scheduled id (what its ``publish(..., run_after=...)`` returned), else None."""
        raw = _raw(self.raw_fields, SCHEDULED_ID_FIELD.encode())
        return None if raw is None else _text(raw)

    @property
    def run_after(self) -> int | None:
        """When a deferred message was due, in ms since the epoch (Redis clock); None for a direct one."""
        raw = _raw(self.raw_fields, RUN_AFTER_FIELD.encode())
        return int(raw) if raw is not None and _text(raw).isdigit() else None

    @property
    def key(self) -> str | None:
        """The key the producer gave, or None: the idempotency guards' key unless ``idempotency_id`` is set."""
        raw = _raw(self.raw_fields, b"key")
        return None if raw is None else _text(raw)

    @property
    def published_at(self) -> int:
        """Milliseconds since the epoch when the producer published it (from the entry id if absent)."""
        raw = _raw(self.raw_fields, b"published_at")
        if raw is not None and _text(raw).isdigit():
            return int(raw)
        return int(self.id.split("-", 1)[0])
