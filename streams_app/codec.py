"""Payload encoding: plain JSON plus a small, language-neutral description of the Python types in it.

An entry's ``payload`` field is always plain JSON. Values JSON has no type for are written as the
strings Django's ``DjangoJSONEncoder`` would write (ISO 8601 for dates, times and durations, decimal
text for ``Decimal``, the canonical form of a ``UUID``), and, only when the payload holds any, the
entry gets one more field, ``payload_types``: a JSON object mapping the JSON Pointer (RFC 6901) of
each such value to its type::

    payload        {"at":"2026-11-30T20:29:11.364826+00:00","total":"9.99","id":"0b6c…"}
    payload_types  {"/at":"datetime","/total":"decimal","/id":"uuid"}

A non-Python consumer reads ``payload`` as the JSON it is and may ignore ``payload_types``; Shoal's
consumers turn each listed value back into its type before the handler sees it. Payloads without
such values (and entries of other producers, in ``payload`` or ``data``) have no ``payload_types``
and decode exactly as before.

Two engines write and read the JSON: ``json`` (the standard library) and ``orjson`` (optional, a C
library). Both produce the same envelope, so any consumer reads any producer's entries. See
docs/publishing.md for the formats and what the envelope costs.
"""
import datetime
import decimal
import json
import math
import re
import uuid
from functools import cache

from django.core.signals import setting_changed
from django.utils.dateparse import parse_duration
from django.utils.duration import duration_iso_string
from django.utils.functional import Promise

from streams_app.exceptions import PayloadDecodeError, PublishError

TYPES_FIELD = "payload_types"

_ENCODERS = (  # order matters: a datetime is also a date
    (datetime.datetime, "datetime", datetime.datetime.isoformat),
    (datetime.date, "date", datetime.date.isoformat),
    (datetime.time, "time", datetime.time.isoformat),
    (datetime.timedelta, "timedelta", duration_iso_string),
    (decimal.Decimal, "decimal", str),
    (uuid.UUID, "uuid", str),
)


def _parse_duration(text):
    value = parse_duration(text)
    if value is None:
        raise ValueError(f"{text!r} is not an ISO 8601 duration")
    return value


def _parse_decimal(text):
    value = decimal.Decimal(text)  # raises InvalidOperation, an ArithmeticError
    if not value.is_finite():
        raise ValueError(f"{text!r} is not a finite decimal")
    return value


DECODERS = {
    "datetime": datetime.datetime.fromisoformat,
    "date": datetime.date.fromisoformat,
    "time": datetime.time.fromisoformat,
    "timedelta": _parse_duration,
    "decimal": _parse_decimal,
    "uuid": uuid.UUID,
}


class _Unknown(Exception):
    """Raised from an engine's ``default`` hook: the payload needs the walk (typed values or an error)."""


def _bail(value):
    raise _Unknown


# -- the walk: typed values to text, their pointers recorded; errors named by their key path -------

def _pointer_token(key):
    return key.replace("~", "~0").replace("/", "~1")


def _path_text(parts):
    return "payload" + "".join(f"[{json.dumps(p, ensure_ascii=False)}]" for p in parts)


def _fail(parts, reason):
    raise PublishError(f"{_path_text(parts)}: {reason}")


def _json_key(key, parts):
    """A dict key as the ``json`` module writes it (str, int, float, bool, None), or an error."""
    if isinstance(key, str):
        return str(key)
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    if isinstance(key, int):
        return str(int(key))
    if isinstance(key, float):
        if not math.isfinite(key):
            _fail(parts, f"the key {key!r} is not JSON-serialisable (JSON has no NaN or Infinity)")
        return float.__repr__(key)
    _fail(parts, f"the key {key!r} ({type(key).__name__}) is not JSON-serialisable; keys must be str, int, float, "
                 "bool or None")


def _walk(value, parts, types, active):
    """``value`` as plain JSON values (base types only); each typed value's pointer goes into ``types``."""
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            _fail(parts, f"{value!r} is not JSON-serialisable (JSON has no NaN or Infinity)")
        return float(value)
    if isinstance(value, (dict, list, tuple)):
        if id(value) in active:
            _fail(parts, "circular reference (this container holds itself)")
        active.add(id(value))
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                text = _json_key(key, parts)
                out[text] = _walk(item, [*parts, text], types, active)
        else:
            out = [_walk(item, [*parts, i], types, active) for i, item in enumerate(value)]
        active.discard(id(value))
        return out
    for cls, name, encode in _ENCODERS:
        if isinstance(value, cls):
            if name == "decimal" and not value.is_finite():
                _fail(parts, f"Decimal({str(value)!r}) is not JSON-serialisable (JSON has no NaN or Infinity)")
            types["".join("/" + _pointer_token(str(p)) for p in parts)] = name
            return encode(value)
    if isinstance(value, Promise):  # a lazy translation: its text, as DjangoJSONEncoder writes it
        return str(value)
    _fail(parts, f"{type(value).__name__} is not JSON-serialisable")


def plain(payload):
    """(plain JSON value, {pointer: type}) of ``payload``; PublishError naming the first bad key path."""
    types = {}
    return _walk(payload, [], types, set()), types


# -- engines ----------------------------------------------------------------------------------------

def _std_dumps(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_bail)


class JsonEngine:
    """The standard library's ``json``: always there, exact for every int."""

    name = "json"
    loads = staticmethod(json.loads)

    def dumps(self, payload):
        """(UTF-8 bytes of the payload, types dict or None)."""
        try:
            body = _std_dumps(payload)
        except (_Unknown, TypeError, ValueError):
            # Typed values, or bad input: the walk converts the one and names the other's key path.
            converted, types = plain(payload)
            return _utf8(_std_dumps(converted)), types or None
        return _utf8(body), None


def _utf8(text):
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PublishError(f"payload is not valid Unicode: it holds a lone surrogate {text[exc.start]!r} "
                           f"at position {exc.start}, which UTF-8 cannot encode") from None


# A canonical UUID string anywhere in orjson's output: orjson writes UUID objects itself (it has no
# option to hand them to ``default``), so such a string may be one whose type must be recorded.
_UUID_TEXT = re.compile(rb'"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"')


class OrjsonEngine:
    """``orjson``: several times faster than ``json``, with the envelope and refusals kept the same.

    orjson writes NaN/Infinity as null and UUIDs as strings without asking, so when its output holds
    a ``null`` or a UUID-shaped string the payload is walked to refuse the one and type the other.
    What orjson refuses (ints beyond 64 bits, lone surrogates, ...) goes the ``json`` engine's way.
    Reading, orjson turns ints beyond 64 bits into floats, and refuses lone surrogate escapes: entries
    that may hold those are better read with the ``json`` engine.
    """

    name = "orjson"

    def __init__(self):
        import orjson

        self._dumps = orjson.dumps
        self._options = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_NON_STR_KEYS
        self.loads = orjson.loads
        self._fallback = JsonEngine()

    def dumps(self, payload):
        try:
            body = self._dumps(payload, default=_bail, option=self._options)
        except (_Unknown, TypeError):
            return self._fallback.dumps(payload)
        if b"null" in body or _UUID_TEXT.search(body):
            converted, types = plain(payload)
            if types:
                return self._dumps(converted, option=self._options), types
        return body, None


def engine_error(name):
    """Why the engine ``name`` cannot run here, or ''."""
    try:
        ENGINES[name]()
    except ImportError as exc:
        return f"it cannot be imported ({exc})"
    return ""


ENGINES = {"json": JsonEngine, "orjson": OrjsonEngine}


@cache
def engine(name=None):
    """The engine called ``name`` (``STREAMS["CODEC"]`` when None)."""
    if name is None:
        from streams_app.conf import setting

        name = setting("CODEC")
    try:
        return ENGINES[name]()
    except KeyError:
        raise PublishError(f"unknown codec {name!r}; the codecs are {', '.join(map(repr, ENGINES))}") from None
    except ImportError:
        raise PublishError(f"codec {name!r} needs the {name} package: pip install {name}") from None


def _reset(*, setting, **kwargs):
    if setting == "STREAMS":
        engine.cache_clear()


setting_changed.connect(_reset, weak=False)


def encode(payload, codec=None):
    """(payload bytes, ``payload_types`` text or None) of ``payload``; PublishError for bad input."""
    body, types = engine(codec).dumps(payload)
    return body, (None if types is None else json.dumps(types, separators=(",", ":"), ensure_ascii=False))


# -- decoding -----------------------------------------------------------------------------------------

def _tokens(pointer):
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"{pointer!r} is not a JSON Pointer")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def apply_types(value, types):
    """``value`` with each value listed in ``types`` ({pointer: type}) turned back into its type.

    Raises ValueError naming the pointer when a listed value is missing, not text, or not of its type.
    """
    if not isinstance(types, dict):
        raise ValueError("payload_types must be a JSON object of JSON Pointer -> type")
    for pointer, name in types.items():
        decode = DECODERS.get(name)
        if decode is None:
            raise ValueError(f"payload_types: unknown type {name!r} at {pointer!r}")
        tokens = _tokens(pointer)
        parent, last = None, None
        node = value
        for token in tokens:
            parent = node
            if isinstance(node, dict) and token in node:
                last = token
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                last = int(token)
            else:
                raise ValueError(f"payload_types: {pointer!r} is not in the payload")
            node = node[last]
        if not isinstance(node, str):
            raise ValueError(f"payload_types: the value at {pointer!r} is not text, so not a {name}")
        try:
            typed = decode(node)
        except (ValueError, ArithmeticError):
            raise ValueError(f"payload_types: {node!r} at {pointer!r} is not a {name}") from None
        if parent is None:
            value = typed
        else:
            parent[last] = typed
    return value


def decode(raw, raw_types=None, loads=None, entry_id="?"):
    """The payload of an entry as its Python values; PayloadDecodeError for poison input."""
    try:
        value = (loads or engine().loads)(raw)
    except (ValueError, UnicodeDecodeError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise PayloadDecodeError(f"entry {entry_id}: payload is not valid JSON ({exc})") from None
    if raw_types is None:
        return value
    try:
        return apply_types(value, json.loads(raw_types))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadDecodeError(f"entry {entry_id}: {exc}") from None
