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
from functools import cache, lru_cache

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


_BY_TYPE = {cls: (name, encode) for cls, name, encode in _ENCODERS}  # the exact types, found in one lookup


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
#
# Only payloads that hold a typed value (or bad input) are walked: plain ones go through the engine
# alone. The walk carries the JSON Pointer as a string; the Python key path of an error is built
# only when there is one, as the error unwinds.

class _Bad(Exception):
    def __init__(self, reason):
        self.reason = reason
        self.path = []  # keys and indexes, innermost last, filled in while unwinding


def _token(key):
    return key.replace("~", "~0").replace("/", "~1") if ("~" in key or "/" in key) else key


def _json_key(key):
    """A dict key as the ``json`` module writes it (str, int, float, bool, None), or _Bad."""
    if isinstance(key, str):
        return str(key)
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    if isinstance(key, int):
        return str(int(key))
    if isinstance(key, float):
        if not math.isfinite(key):
            raise _Bad(f"the key {key!r} is not JSON-serialisable (JSON has no NaN or Infinity)")
        return float.__repr__(key)
    raise _Bad(f"the key {key!r} ({type(key).__name__}) is not JSON-serialisable; keys must be str, int, float, "
               "bool or None")


def _walk(value, pointer, types, active):
    """``value`` as plain JSON values (base types only); each typed value's pointer goes into ``types``."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise _Bad(f"{value!r} is not JSON-serialisable (JSON has no NaN or Infinity)")
        return value
    exact = _BY_TYPE.get(kind)
    if exact is not None and kind is not decimal.Decimal:
        types[pointer] = exact[0]
        return exact[1](value)
    if isinstance(value, (dict, list, tuple)):
        if id(value) in active:
            raise _Bad("circular reference (this container holds itself)")
        active.add(id(value))
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                text = key if type(key) is str else _json_key(key)
                try:
                    out[text] = _walk(item, pointer + "/" + _token(text), types, active)
                except _Bad as bad:
                    bad.path.append(text)
                    raise
        else:
            out = []
            for index, item in enumerate(value):
                try:
                    out.append(_walk(item, f"{pointer}/{index}", types, active))
                except _Bad as bad:
                    bad.path.append(index)
                    raise
        active.discard(id(value))
        return out
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):  # bool and int subclasses (IntEnum...) as json writes them
        return value if isinstance(value, bool) else int(value)
    if isinstance(value, float):
        return _walk(float(value), pointer, types, active)
    for cls, name, encode in _ENCODERS:
        if isinstance(value, cls):
            if name == "decimal" and not value.is_finite():
                raise _Bad(f"Decimal({str(value)!r}) is not JSON-serialisable (JSON has no NaN or Infinity)")
            types[pointer] = name
            return encode(value)
    if isinstance(value, Promise):  # a lazy translation: its text, as DjangoJSONEncoder writes it
        return str(value)
    raise _Bad(f"{type(value).__name__} is not JSON-serialisable")


def plain(payload):
    """(plain JSON value, {pointer: type}) of ``payload``; PublishError naming the first bad key path."""
    types = {}
    try:
        return _walk(payload, "", types, set()), types
    except _Bad as bad:
        path = "".join(f"[{json.dumps(p, ensure_ascii=False)}]" for p in reversed(bad.path))
        raise PublishError(f"payload{path}: {bad.reason}") from None


def _has_non_finite(value):
    """Whether a float in ``value`` is NaN or infinite: what orjson would silently write as null."""
    kind = type(value)
    if kind is float:
        return not math.isfinite(value)
    if kind is dict:
        value = value.values()
    elif kind is not list and kind is not tuple:
        return isinstance(value, float) and not math.isfinite(value)
    for item in value:
        kind = type(item)
        if kind is float:
            if not math.isfinite(item):
                return True
        elif kind is dict or kind is list or kind is tuple or isinstance(item, float):
            if _has_non_finite(item):
                return True
    return False


# -- engines ----------------------------------------------------------------------------------------

# One encoder, made once: json.dumps with options builds a new one per call.
_std_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_bail).encode


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
# 19 digits in a row may be an integer beyond int64 (9223372036854775807): found by mapping every digit
# to "0" and looking for 19 zeros, several times faster than a regular expression.
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_NINETEEN_ZEROS = b"0" * 19


class OrjsonEngine:
    """``orjson``: several times faster than ``json``, with the envelope and refusals kept the same.

    orjson writes NaN/Infinity as null and UUIDs as strings without asking: when its output holds a
    ``null``, the payload's floats are checked (a lean walk); when it holds a UUID-shaped string, the
    payload is walked to record the UUIDs' types.
    What orjson refuses (ints beyond 64 bits, lone surrogates, ...) goes the ``json`` engine's way.
    Reading, what orjson would read otherwise than ``json`` goes to ``json`` too: text that orjson
    refuses (lone surrogate escapes, NaN literals...) and text with 19 digits in a row, which may be
    an integer beyond 64 bits that orjson would turn into a float.
    """

    name = "orjson"

    def __init__(self):
        import orjson

        self._dumps = orjson.dumps
        self._options = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_NON_STR_KEYS
        self._loads = orjson.loads
        self._fallback = JsonEngine()

    def loads(self, raw):
        # A decoded client's str goes to json too.
        if type(raw) is bytes and _NINETEEN_ZEROS not in raw.translate(_DIGITS_TO_ZERO):
            try:
                return self._loads(raw)
            except ValueError:  # orjson.JSONDecodeError; json says what is wrong, or accepts it as before
                pass
        return json.loads(raw)

    def dumps(self, payload):
        try:
            body = self._dumps(payload, default=_bail, option=self._options)
        except (_Unknown, TypeError):
            return self._fallback.dumps(payload)
        if b"null" in body and _has_non_finite(payload):
            plain(payload)  # raises, naming the key path of the NaN
        # A UUID's text has four dashes: counting them is cheaper than the search, which most payloads skip.
        if body.count(b"-") >= 4 and _UUID_TEXT.search(body):
            converted, types = plain(payload)
            if types:
                return _right_sized(self._dumps(converted, option=self._options)), types
        return _right_sized(body), None


def _right_sized(body):
    """A copy of orjson's output in an object of its own size.

    orjson hands back the buffer it wrote into, made with room to spare and shrunk in place. Kept alive
    by the hundred (publish_many encodes a whole batch before sending it), those buffers fragment the
    heap and every later dumps lands on fresh pages: measured 2-5 µs per small payload at 1,000 alive,
    against 0.3 µs with this copy, which frees orjson's buffer at once for the next dumps to reuse.
    """
    return bytes(memoryview(body))


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
    try:
        body, types = engine(codec).dumps(payload)
    except RecursionError:
        raise PublishError("payload is nested too deeply (or refers to itself) to encode as JSON") from None
    return body, (None if types is None else _std_dumps(types))


# -- decoding -----------------------------------------------------------------------------------------

def _tokens(pointer):
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"{pointer!r} is not a JSON Pointer")
    tokens = pointer[1:].split("/")
    return [t.replace("~1", "/").replace("~0", "~") for t in tokens] if "~" in pointer else tokens


def _plan(types):
    """[(pointer, tokens, name, decoder)] of a ``payload_types`` object; ValueError if it is not one."""
    if not isinstance(types, dict):
        raise ValueError("payload_types must be a JSON object of JSON Pointer -> type")
    plan = []
    for pointer, name in types.items():
        decoder = DECODERS.get(name) if isinstance(name, str) else None
        if decoder is None:
            raise ValueError(f"payload_types: unknown type {name!r} at {pointer!r}")
        plan.append((pointer, _tokens(pointer), name, decoder))
    return plan


@lru_cache(maxsize=1024)
def _cached_plan(raw_types):
    # Entries of one kind share one payload_types text: parse it once, not per message.
    return _plan(json.loads(raw_types))


def apply_types(value, types):
    """``value`` with each value listed in ``types`` ({pointer: type}) turned back into its type.

    Raises ValueError naming the pointer when a listed value is missing, not text, or not of its type.
    """
    return _apply(value, _plan(types))


def _apply(value, plan):
    for pointer, tokens, name, decoder in plan:
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
            typed = decoder(node)
        except (ValueError, ArithmeticError):
            raise ValueError(f"payload_types: {node!r} at {pointer!r} is not a {name}") from None
        if parent is None:
            value = typed
        else:
            parent[last] = typed
    return value


def decode(raw, raw_types=None, entry_id="?"):
    """The payload of an entry as its Python values; PayloadDecodeError for poison input."""
    try:
        value = engine().loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise PayloadDecodeError(f"entry {entry_id}: payload is not valid JSON ({exc})") from None
    except RecursionError:  # nested deeper than Python's parser goes: poison like any undecodable payload
        raise PayloadDecodeError(f"entry {entry_id}: payload is nested too deeply to decode") from None
    if raw_types is None:
        return value
    try:
        return _apply(value, _cached_plan(raw_types))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadDecodeError(f"entry {entry_id}: {exc}") from None
