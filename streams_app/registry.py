"""The ``@consumer`` decorator and the table of declared consumers."""
from __future__ import annotations

import difflib
import functools
import inspect
import math
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from asgiref.sync import iscoroutinefunction

from streams_app.partitioning import partitions
from streams_app.exceptions import ConsumerConfigError, PublishError
from streams_app.redis.names import validate_stream_name

if TYPE_CHECKING:
    from streams_app.publishing.message import Message

# What @consumer decorates, and gives back unchanged: a callable taking the message (an ``async def`` is awaited).
H = TypeVar("H", bound=Callable[["Message"], Any])

_START_CHOICES = ("0", "$")
IDEMPOTENT_CHOICES = (None, "redis", "db")
RETENTION_CHOICES = (None, "acked")


@dataclass(frozen=True)
class ConsumerSpec:
    stream: str
    group: str
    handler: Callable[..., Any] = field(compare=False)
    start: str = "0"
    batch: int | None = None
    max_deliveries: int = 5
    options: dict[str, Any] = field(default_factory=dict, compare=False)
    is_async: bool = False  # the handler is awaited on the worker's event loop (see handler_kind)
    # A partition of a partitioned stream (streams_app.partitioning.partitions): ``stream`` is the partition's
    # key, ``logical_stream`` the declared name.
    logical_stream: str | None = None
    partition: int | None = None
    # Priority bands (``bands=``): the streams of the higher bands; this spec reads new entries only
    # while none of them has entries the group has not yet read (streams_app.consuming.bands).
    yields_to: tuple[str, ...] = ()

    @property
    def logical(self) -> str:
        return self.logical_stream or self.stream

    @property
    def retry_backoff(self) -> tuple[float, float | None] | None:
        """(base, cap) in seconds, or None for the STREAMS defaults."""
        return self.options.get("retry_backoff")

    @property
    def idempotent(self) -> str | None:
        return self.options.get("idempotent")

    @property
    def retention(self) -> str | None:
        return self.options.get("retention")

    @property
    def bands(self) -> tuple[str, ...] | None:
        """Priority bands, highest first: stream-name suffixes, "" for the stream itself (see consumer())."""
        return self.options.get("bands")

    @property
    def ordered(self) -> bool:
        """Ordered mode: one owner per partition, one handler at a time (streams_app.consuming.ordered)."""
        return bool(self.options.get("ordered"))

    @property
    def name(self) -> str:
        return f"{self.stream}:{self.group}"

    @property
    def handler_path(self) -> str:
        return describe_handler(self.handler)


def describe_handler(handler: object) -> str:
    """A dotted name for any callable: functions, methods, callable objects, functools.partial.

    The admin and the reclaim daemon show it; it must never raise, whatever was registered. A handler
    Shoal builds itself (a task queue's) names itself in ``shoal_handler_name``: its partial or
    instance repr would tell an operator nothing.
    """
    label = getattr(handler, "shoal_handler_name", None)
    if isinstance(label, str) and label:
        return label
    if isinstance(handler, functools.partial):
        arguments = [describe_handler(handler.func), *map(repr, handler.args),
                     *(f"{k}={v!r}" for k, v in handler.keywords.items())]
        return f"functools.partial({', '.join(arguments)})"
    name = getattr(handler, "__qualname__", None) or getattr(handler, "__name__", None)
    module = getattr(handler, "__module__", None)
    if not isinstance(name, str):  # an instance with __call__: named after its class
        cls = type(handler)
        module, name = cls.__module__, f"{cls.__qualname__} instance"
    return f"{module}.{name}" if module else name


_registry: dict[tuple[str, str], ConsumerSpec] = {}


def _check_name(kind: str, name: str) -> str:
    """Refuse what cannot be typed on runconsumer's command line or shown in the admin and logs.

    NUL and other control characters, names of only whitespace, lone surrogates (UTF-8, which
    Redis and PostgreSQL store, cannot encode them): each makes a consumer nobody can select, or a
    failure far from the declaration (at the first read, in the admin, in PostgreSQL).
    """
    if not name.strip():
        raise ConsumerConfigError(f"{kind} name {name!r} is only whitespace; give it a visible name")
    for position, char in enumerate(name):
        if unicodedata.category(char) in ("Cc", "Cs"):
            what = "a lone surrogate" if unicodedata.category(char) == "Cs" else "a control character"
            raise ConsumerConfigError(f"{kind} name {name!r} holds {what} ({char!r} at position {position}); "
                                      "names are printable text (letters, digits, '-', '.', '_', ':' in streams)")
    return name


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an int too large for a float
        return False


def _check_backoff(value: object) -> tuple[float, float | None] | None:
    """``retry_backoff`` is a base in seconds (doubling per delivery, capped by RETRY_BACKOFF_MAX) or (base, cap)."""
    if value is None:
        return None
    pair = value if isinstance(value, (tuple, list)) else (value, None)
    if len(pair) != 2:
        raise ConsumerConfigError(f"retry_backoff must be seconds or (base, cap) seconds, not {value!r}")
    for number in pair:
        if number is not None and (isinstance(number, bool) or not isinstance(number, (int, float))
                                   or not _finite(number) or number < 0):
            # nan would never be due (no retry, and a crash converting it to ms); inf never either.
            raise ConsumerConfigError(f"retry_backoff must be seconds or (base, cap) seconds (finite, 0 or more), "
                                      f"not {value!r}")
    if pair[1] is not None and pair[1] < pair[0]:
        raise ConsumerConfigError(f"retry_backoff cap {pair[1]!r} is below its base {pair[0]!r}")
    return (float(pair[0]), None if pair[1] is None else float(pair[1]))


def _call_target(handler: Any) -> Any:
    """What calling ``handler`` runs: the function itself, a partial's function, an object's ``__call__``."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    if inspect.isfunction(handler) or inspect.ismethod(handler) or inspect.isbuiltin(handler):
        return handler
    if isinstance(handler, type):
        return handler  # a class: calling it makes an instance, which is what runs
    return type(handler).__call__  # an object with __call__ (callable() was checked first)


def handler_kind(handler: object) -> Literal["sync", "async"]:
    """"sync" or "async"; raises ConsumerConfigError for anything whose call would not run the work.

    A generator function (or async generator function) returns an unstarted generator when called:
    its body would never run, yet the entry would be acked. Refused here, at import time, rather
    than found out by messages that vanish.
    """
    if not callable(handler):
        raise ConsumerConfigError(
            f"@consumer decorates a callable taking the message, not {type(handler).__name__} {handler!r}")
    target = _call_target(handler)
    name = describe_handler(handler)
    if inspect.isasyncgenfunction(target):
        raise ConsumerConfigError(
            f"handler {name} is an async generator function (async def with yield): calling it runs nothing. "
            "A handler is a plain function or an async def without yield.")
    if inspect.isgeneratorfunction(target):
        raise ConsumerConfigError(
            f"handler {name} is a generator function (it contains yield): calling it runs nothing, so every "
            "message would be acked unhandled. Remove the yield (collect into a list if needed).")
    return "async" if iscoroutinefunction(handler) or iscoroutinefunction(target) else "sync"


# Keyword arguments of consumer() after ``stream``: an unknown one is a typo of one of these.
_OPTIONS = ("group", "start", "batch", "max_deliveries", "retry_backoff", "idempotent", "retention", "ordered",
            "bands")


def _refuse_unknown(options: dict[str, Any]) -> None:
    for name in options:
        close = difflib.get_close_matches(name, _OPTIONS, n=1)
        hint = f"; did you mean {close[0]}?" if close else "."
        raise ConsumerConfigError(f"@consumer got an unknown option {name}={options[name]!r}{hint} "
                                  f"Valid options: {', '.join(_OPTIONS)}.")


def consumer(stream: str | None = None, *, group: str | None = None, start: Literal["0", "$"] = "0",
             batch: int | None = None, max_deliveries: int = 5,
             retry_backoff: float | tuple[float, float | None] | None = None,
             idempotent: Literal["redis", "db"] | None = None, retention: Literal["acked"] | None = None,
             ordered: bool = False, bands: Sequence[str] | None = None, **options: Any) -> Callable[[H], H]:
    """Register ``handler(message)`` for ``group`` on ``stream``.

    ``start`` is where a new group begins: "0" (the whole stream) or "$" (only new entries).
    ``max_deliveries``: deliveries before a failing entry goes to the dead-letter stream.
    ``retry_backoff``: seconds before the first retry, doubling per delivery; or (base, cap).
    ``idempotent``: None, "redis" (a SET NX guard per message key) or "db" (a ProcessedMessage row
    written in the handler's own transaction). ``retention="acked"``: the reclaim daemon trims
    entries every group of the stream has acknowledged. ``ordered=True``: each partition (a stream that is
    not partitioned is one partition) is read by one consumer of the group at a time, through a lease,
    one message at a time, so per-key order holds (docs/cluster.md "Ordered mode").
    ``bands``: priority bands, highest first, as suffixes of the stream name ("" for the stream
    itself): ``bands=("high", "", "low")`` reads ``S:high``, ``S`` and ``S:low``, each a stream of
    its own with the same handler and group, and a band reads new entries only while the bands
    above it have none unread (streams_app/consuming/bands.py). Selected as one: ``S:GROUP``.

    ``handler`` may be a function (run in a handler thread) or an ``async def`` (awaited on the
    worker's event loop). Generator functions and non-callables are refused.
    """
    if callable(stream):  # @consumer without parentheses: the function came as the stream
        raise ConsumerConfigError(
            f"@consumer needs a stream and a group: @consumer('stream', group='...') above def "
            f"{getattr(stream, '__name__', '...')}, not a bare @consumer.")
    if stream is None or group is None:
        given = ([repr(stream)] if stream is not None else []) + ([f"group={group!r}"] if group is not None else [])
        raise ConsumerConfigError(f"@consumer needs a stream and a group: @consumer({stream or 'stream'!r}, group='...'), "
                                  f"not @consumer({', '.join(given)}).")
    _refuse_unknown(options)
    try:
        validate_stream_name(stream)
    except PublishError as exc:
        raise ConsumerConfigError(str(exc)) from None
    _check_name("stream", stream)
    if not isinstance(group, str) or not group:
        raise ConsumerConfigError(f"group must be a non-empty string, not {group!r}")
    _check_name("group", group)
    if ":" in group:
        # runconsumer selects STREAM:GROUP split at the last ':' (stream names often hold ':'), so a
        # group with ':' could never be selected.
        raise ConsumerConfigError(f"group name {group!r} must not contain ':' (runconsumer selects consumers as "
                                  f"STREAM:GROUP); use '-' or '.', e.g. {group.replace(':', '-')!r}")
    if start not in _START_CHOICES:
        raise ConsumerConfigError(f"start must be '0' or '$', not {start!r}")
    if batch is not None and (not isinstance(batch, int) or batch <= 0):
        raise ConsumerConfigError(f"batch must be a positive integer, not {batch!r}")
    if isinstance(max_deliveries, bool) or not isinstance(max_deliveries, int) or max_deliveries <= 0:
        raise ConsumerConfigError(f"max_deliveries must be a positive integer, not {max_deliveries!r}")
    if idempotent not in IDEMPOTENT_CHOICES:
        raise ConsumerConfigError(f"idempotent must be None, 'redis' or 'db', not {idempotent!r}")
    if retention not in RETENTION_CHOICES:
        raise ConsumerConfigError(f"retention must be None or 'acked', not {retention!r}")
    if not isinstance(ordered, bool):
        raise ConsumerConfigError(f"ordered must be True or False, not {ordered!r}")
    options = {"retry_backoff": _check_backoff(retry_backoff), "idempotent": idempotent, "retention": retention,
               "ordered": ordered, "bands": _check_bands(bands, ordered)}

    def register(handler: H) -> H:
        is_async = handler_kind(handler) == "async"
        if is_async and idempotent == "db":
            raise ConsumerConfigError(
                f"{stream}:{group}: idempotent='db' cannot guard an async handler. The guard row must be written "
                "in the same database transaction as the handler's writes, and Django's transactions do not "
                "work in async code (each async ORM call runs on its own, outside any atomic block). Use a "
                "sync handler (def) with idempotent='db', or idempotent='redis' with this async handler.")
        spec = ConsumerSpec(stream, group, handler, start, batch, max_deliveries, dict(options), is_async)
        existing = _registry.get((stream, group))
        if existing is not None and existing.handler_path != spec.handler_path:
            raise ConsumerConfigError(
                f"{spec.name} already has a handler, {existing.handler_path}; "
                f"{spec.handler_path} cannot be a second one. Use another group name."
            )
        _registry[(stream, group)] = spec
        return handler

    return register


def _check_bands(bands: Sequence[str] | None, ordered: bool) -> tuple[str, ...] | None:
    if bands is None:
        return None
    if isinstance(bands, str) or not isinstance(bands, (tuple, list)) or len(bands) < 2 or "" not in bands:
        raise ConsumerConfigError(f"bands must be a list of stream-name suffixes, highest first, with '' for the "
                                  f"stream itself, e.g. ('high', '', 'low'); not {bands!r}")
    if len(set(bands)) != len(bands) or not all(isinstance(band, str) and ":" not in band for band in bands):
        raise ConsumerConfigError(f"bands must be distinct suffixes without ':', not {bands!r}")
    if ordered:
        raise ConsumerConfigError("bands and ordered=True cannot be combined: bands read by priority, not in order")
    return tuple(bands)


def band_stream(stream: str, band: str) -> str:
    """The stream of one priority band: the stream itself for "", else ``stream:band``."""
    return f"{stream}:{band}" if band else stream


def registered() -> list[ConsumerSpec]:
    """Every declared consumer, sorted by stream then group; a partitioned stream's one per partition."""
    return [spec for key in sorted(_registry) for spec in expand(_registry[key])]


def expand(spec: ConsumerSpec) -> list[ConsumerSpec]:
    """One spec per partition of ``spec.stream`` (the spec itself when it is not partitioned).

    Each partition is an ordinary stream, so everything that works on a stream (reading, takeover,
    retries, dead letters, trimming, the reclaimer, metrics) works per partition unchanged.
    """
    if spec.bands:
        # Bands are not partitioned: each is one stream, in its own slot on a cluster.
        streams = [band_stream(spec.stream, band) for band in spec.bands]
        return [replace(spec, stream=stream, yields_to=tuple(streams[:i])) for i, stream in enumerate(streams)]
    # While a repartition drains the previous epoch, its partitions are read too (streams_app.partitioning.layout).
    names = partitions.reading(spec.stream)
    if len(names) == 1:
        return [spec]
    # A partition's index within its own epoch (the previous epoch's come first in ``names``).
    current = partitions.names(spec.stream)
    return [replace(spec, stream=name, logical_stream=spec.stream, partition=current.index(name) if name in current else i)
            for i, name in enumerate(names)]


def split_selector(selector: str) -> tuple[str, str]:
    """``STREAM:GROUP`` → (stream, group). Stream names contain ':' often, so split at the last one."""
    stream, sep, group = selector.rpartition(":")
    if not sep or not stream or not group:
        raise ConsumerConfigError(f"{selector!r} is not STREAM:GROUP")
    return stream, group


def _under(stream: str) -> str:
    """For a selector that is a stream name without its group (``tasks:emails``, the guess of Celery's
    ``-Q emails``): the selectors of the consumers of that stream and the streams under it."""
    near = [f"{name}:{group}" for name, group in sorted(_registry) if name == stream or name.startswith(stream + ":")]
    if near:
        return f" A selector is STREAM:GROUP; for {stream!r} select {' '.join(near)}."
    band, group = stream.rpartition(":")[::2]
    owner = [f"{name}:{g}" for (name, g), spec in sorted(_registry.items()) if g == group and spec.bands
             and band in [band_stream(name, b) for b in spec.bands]]
    return f" {band!r} is a priority band of {owner[0]}, read by that consumer: select {owner[0]}." if owner else ""


def selectors(specs: Sequence[ConsumerSpec]) -> list[str]:
    """How the start-up line names ``specs``: their selectors, a banded consumer once with its bands'
    streams (a band is read by its consumer and cannot be selected alone)."""
    named = []
    for spec in specs:
        if spec.bands:
            band = spec.bands[len(spec.yields_to)]  # expand(): a band's spec yields to those above it
            declared = spec.stream[:-len(band) - 1] if band else spec.stream
            text = f"{declared}:{spec.group} (bands {', '.join(band_stream(declared, b) for b in spec.bands)})"
        else:
            text = spec.name
        if text not in named:
            named.append(text)
    return named


def select(selectors: Sequence[str] = ()) -> list[ConsumerSpec]:
    """The specs named by ``STREAM:GROUP`` selectors, or all of them when none are given."""
    specs = registered()
    if not specs:
        raise ConsumerConfigError(
            "no consumers are registered. Declare one with @consumer(...) in a consumers.py module "
            "of an installed app."
        )
    if not selectors:
        return specs
    known = ", ".join(f"{stream}:{group}" for stream, group in sorted(_registry))
    chosen: list[ConsumerSpec] = []
    for selector in selectors:
        key = split_selector(selector)
        one_partition = [spec for spec in specs if spec.name == selector and spec.partition is not None]
        if one_partition and one_partition[0].ordered:
            spec = one_partition[0]
            raise ConsumerConfigError(
                f"{selector!r} names one partition of {spec.logical!r}, whose consumer of group {spec.group!r} "
                f"is ordered=True: in ordered mode the partitions are spread over the group's consumers by "
                f"leases, and a consumer of one partition would count as a member of every partition's share, "
                f"leaving partitions without an owner. Select the whole stream ({spec.logical}:{spec.group}); "
                f"the leases give each consumer its partitions (docs/cluster.md, \"Ordered mode\")."
            )
        if one_partition:  # "orders:3:email": one partition of a partitioned stream
            chosen.extend(spec for spec in one_partition if spec not in chosen)
            continue
        if key not in _registry:
            raise ConsumerConfigError(f"no consumer is registered for {selector!r}.{_under(selector)} Registered: {known}")
        chosen.extend(spec for spec in expand(_registry[key]) if spec not in chosen)
    return chosen


def declared(stream: str, group: str | None = None) -> list[ConsumerSpec]:
    """The specs declared for ``stream`` (one ``group`` of it, when given), as declared: partitions unexpanded."""
    return [spec for (s, g), spec in sorted(_registry.items()) if s == stream and group in (None, g)]
