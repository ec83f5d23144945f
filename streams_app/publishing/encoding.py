"""A message's fields as XADD stores them: its payload (through the codec), key and headers, checked
against MAX_PAYLOAD_BYTES. Publishing, the outbox, replays, the task senders and the testing helpers encode
through here, so one message is refused for the same reason wherever it is written."""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from streams_app.publishing import codec as codecs
from streams_app.conf import setting
from streams_app.exceptions import PublishError
from streams_app.redis.names import utf8_size

Fields = dict[str, Any]  # one entry's fields as XADD stores them (text, or the codec's bytes)


def _to_json(value: Any, what: str) -> str:  # what: "headers are"
    """Compact JSON text of ``value``; PublishError for what JSON cannot hold (NaN, Infinity, objects)."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        if "Out of range float" not in str(exc):
            raise PublishError(f"{what} not JSON-serialisable: {exc}") from None
        # Python's json writes them as bare NaN/Infinity, which no JSON parser of a consumer accepts.
        raise PublishError(f"{what} not JSON-serialisable: it holds NaN or Infinity (a number "
                           "such as 1e999 reads as Infinity), which JSON cannot represent") from None
    except TypeError as exc:
        raise PublishError(f"{what} not JSON-serialisable: {exc}") from None


def encode_payload(payload: Any, codec: str | None = None, limit: int | None = None) -> tuple[bytes, str | None, int]:
    """(payload bytes, ``payload_types`` text or None, size in bytes) of ``payload``; PublishError for what
    cannot be one (not JSON, NaN/Infinity, a lone surrogate, over MAX_PAYLOAD_BYTES). Publish and replay share it."""
    body, types = codecs.encode(payload, codec)
    if limit is None:
        limit = setting("MAX_PAYLOAD_BYTES")
    size = len(body)  # bytes already: the size is exact
    if size > limit:
        raise PublishError(f"payload is {size} bytes, over the limit of {limit} (STREAMS['MAX_PAYLOAD_BYTES'])")
    if types is not None:
        size += utf8_size(types, "payload types")
    return body, types, size


def encode_message(payload: Any, *, key: str | None = None, headers: Mapping[str, Any] | None = None,
                   codec: str | None = None) -> Fields:
    """The fields of one entry. Raises PublishError for input that cannot be a message.

    ``codec`` names the engine that writes the JSON (default ``STREAMS["CODEC"]``); see streams_app/publishing/codec.py.
    """
    return _MessageEncoder(headers, codec)(payload, key)


def message_encoder(headers: Mapping[str, Any] | None = None, codec: str | None = None) -> _MessageEncoder:
    """``encode_message`` for many messages that share ``headers`` and ``codec``: call it with
    ``(payload, key=None)``; what they share is worked out once."""
    return _MessageEncoder(headers, codec)


class _MessageEncoder:
    """``encode_message`` for the messages of one publish call, which share headers, codec and limit.

    What cannot differ between them is worked out once per call, not once per message: the size
    limit, the headers' JSON (after the first message's payload, so that a message with a bad
    payload and bad headers is refused for its payload, as one at a time) and the clock's text
    (per millisecond). publish_many of small payloads spends a few µs per message in all.
    """

    def __init__(self, headers: Mapping[str, Any] | None, codec: str | None) -> None:
        self.headers, self.codec = headers, codec
        self.limit: int = setting("MAX_PAYLOAD_BYTES")
        self._headers_json: str | None = None
        self._headers_size = 0
        self._ms: int | None = None
        self._ms_text = ""

    def __call__(self, payload: Any, key: str | None = None) -> Fields:
        body, types, size = encode_payload(payload, self.codec, self.limit)
        ms = int(time.time() * 1000)
        if ms != self._ms:
            self._ms, self._ms_text = ms, str(ms)
        fields: Fields = {"payload": body, "published_at": self._ms_text}
        if types is not None:
            fields[codecs.TYPES_FIELD] = types
        if key is not None:
            if not isinstance(key, str) or not key:
                raise PublishError(f"key must be a non-empty string, not {key!r}")
            fields["key"] = key
            size += utf8_size(key, "key")
        if self.headers:
            if self._headers_json is None:
                self._encode_headers()
            fields["headers"] = self._headers_json
            size += self._headers_size
        if size > self.limit:
            # The limit protects Redis and every consumer's memory: key and headers count as much as the payload.
            raise PublishError(f"entry is {size} bytes (payload, its types, key and headers), over the limit of "
                               f"{self.limit} (STREAMS['MAX_PAYLOAD_BYTES'])")
        return fields

    def _encode_headers(self) -> None:
        if not isinstance(self.headers, dict):
            raise PublishError(f"headers must be a dict, not {type(self.headers).__name__}")
        text = _to_json(self.headers, "headers are")
        self._headers_size = utf8_size(text, "headers")
        self._headers_json = text
