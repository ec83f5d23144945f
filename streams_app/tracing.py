"""OpenTelemetry tracing: everything Shoal does with ``opentelemetry-api`` is in this module (docs/tracing.md).

The package is an optional extra (``django-shoal[otel]``). Nothing here imports it at import time: the
first ``active()`` call tries once, and without it every later call is one global check. With the API
but no tracer provider set (no SDK configured), nothing records a span anyway, so Shoal makes none and
injects nothing: ``active()`` is False there too, and the hot paths pay one provider check per publish
or per read of a consumer, not per message.

What travels: the W3C trace context (the global propagator, ``traceparent``/``tracestate``) in the
message's ``headers``, written where the headers are encoded, so an outbox row holds the context of
its ``publish()`` call and the relay sends it as it is. What is recorded, in the messaging semantic
conventions: a PRODUCER span per publish call, ``publish <stream>``, and a CONSUMER span per handler
run, ``process <stream>``, a child of the producer's context (a replayed dead letter starts a trace
of its own with a link to the original). A handler's raise is its span's ERROR, with the exception;
what the consumer does next (a retry, the dead-letter stream) and a takeover are span events.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from streams_app.exceptions import RejectMessage

SYSTEM = "redis"  # messaging.system: no registered value names Redis Streams; the server it is
TRACER_NAME = "streams_app"
REPLAY_OF_FIELD = b"shoal:replay_of"  # set by the replay script on a replayed dead letter (deadletters/replay.py)

_api: Any = None  # a namespace of the opentelemetry names used here, once imported
_missing = False  # the import failed: tracing stays off for the life of the process
_tracer: tuple[Any, Any] = (None, None)  # (provider, its tracer): a tracer is made once per provider
_NULL = contextlib.nullcontext()
# The task being enqueued (name, result id): its publish span says which (streams_app/tasks/backend.py).
_task: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("shoal_tracing_task", default=None)


def _load() -> Any:
    global _api, _missing
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        _missing = True
        return None

    class api:  # noqa: N801 -- a namespace
        pass

    api.trace, api.propagate = trace, propagate
    api.off = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    api.PRODUCER, api.CONSUMER = trace.SpanKind.PRODUCER, trace.SpanKind.CONSUMER
    api.Status, api.ERROR, api.Link = trace.Status, trace.StatusCode.ERROR, trace.Link
    _api = api
    return api


def active() -> bool:
    """Whether spans are recorded: opentelemetry-api is installed and a tracer provider is set."""
    if _missing:
        return False
    api = _api or _load()
    if api is None:
        return False
    return not isinstance(api.trace.get_tracer_provider(), api.off)


def _get_tracer() -> Any:
    global _tracer
    provider = _api.trace.get_tracer_provider()
    if _tracer[0] is not provider:
        _tracer = (provider, provider.get_tracer(TRACER_NAME))
    return _tracer[1]


# -- publishing --------------------------------------------------------------------------------

class Publishing:
    """The PRODUCER span of one publish call while it runs; ``headers`` carry its context."""

    def __init__(self, span: Any, headers: Any) -> None:
        self.span = span
        self.headers = headers

    def sent(self, entry_id: Any) -> None:
        """The entry id of a single message (None: queued on a pipeline, or through the outbox)."""
        if entry_id is not None:
            self.span.set_attribute("messaging.message.id", entry_id)


@contextlib.contextmanager
def publishing(stream: str, headers: Mapping[str, Any] | None, count: int = 1, *,
               outbox: bool = False) -> Iterator[Publishing]:
    """The span ``publish <stream>`` around a publish of ``count`` messages; call only when ``active()``.

    The headers given are copied with the span's context injected; headers that are not a dict are
    left as they are, for the encoder to refuse as it always does.
    """
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM, "messaging.destination.name": stream,
        "messaging.operation.name": "publish", "messaging.operation.type": "send",
    }
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    if outbox:
        attributes["shoal.outbox"] = True
    task = _task.get()
    if task is not None:
        attributes["shoal.task.name"], attributes["shoal.task.result_id"] = task
    with _get_tracer().start_as_current_span(f"publish {stream}", kind=_api.PRODUCER, attributes=attributes) as span:
        if headers is None or isinstance(headers, dict):
            # The caller's own trace fields belong to another trace: this span's context replaces them.
            carrier = {name: value for name, value in (headers or {}).items() if name not in _TRACE_FIELDS}
            _api.propagate.inject(carrier)
            headers = carrier
        yield Publishing(span, headers)


_TRACE_FIELDS = ("traceparent", "tracestate")


def _extracted(api: Any, headers: Any) -> Any:
    """The context the message's headers carry; None (a trace of its own) for headers the propagators
    cannot read. Only text values are offered to them: a producer that is not Shoal, or a hand-written
    XADD, may send ``{"traceparent": 123}``, and a propagator's raise would fail the message before its
    handler runs, only because tracing is on."""
    if not isinstance(headers, dict):
        return None
    carrier = {name: value for name, value in headers.items() if isinstance(value, str)}
    try:
        return api.propagate.extract(carrier)
    except Exception:  # noqa: BLE001 -- a header no propagator can read is no parent, never the message's failure
        return None


def task(name: str, result_id: str) -> contextlib.AbstractContextManager[Any]:
    """Around a task's enqueue: its publish span names the task and its result id."""
    if not active():
        return _NULL
    return _task_context(name, result_id)


@contextlib.contextmanager
def _task_context(name: str, result_id: str) -> Iterator[None]:
    token = _task.set((name, result_id))
    try:
        yield
    finally:
        _task.reset(token)


def task_run(name: str, result_id: str) -> None:
    """Inside a task's handler run: its CONSUMER span names the task and its result id."""
    if _api is None:  # never imported: no consumer span can be current
        return
    span = _api.trace.get_current_span()
    if span.is_recording():
        span.set_attributes({"shoal.task.name": name, "shoal.task.result_id": result_id})


# -- consuming -------------------------------------------------------------------------------------

class ConsumerTracing:
    """A read loop's tracing: its handler wrapped in CONSUMER spans, and the ids it took over.

    ``retry_in(deliveries)``: seconds until a failed entry is retried (the loop's back-off), for the
    retry event. Made only where opentelemetry imports (``for_consumer``).
    """

    def __init__(self, max_deliveries: int, retry_in: Callable[[int], float], dead_letter_stream: str) -> None:
        self.max_deliveries = max_deliveries
        self.retry_in = retry_in
        self.dead_letter_stream = dead_letter_stream
        self.taken_over: set[str] = set()
        self._wrapped: dict[int, Any] = {}

    def handler(self, handler: Any, is_async: bool) -> Any:
        """``handler`` wrapped in spans while tracing is active, else ``handler`` itself (checked per read)."""
        if not active():
            return handler
        wrapped = self._wrapped.get(id(handler))
        if wrapped is None:
            wrapped = self._wrapped[id(handler)] = (_TracedAsync if is_async else _Traced)(self, handler)
        return wrapped

    def took_over(self, entries: list[Any]) -> None:
        """``entries`` (id, fields, deliveries) were claimed from other consumers: their spans say so."""
        if entries and active():
            self.taken_over.update(entry[0] for entry in entries)

    @contextlib.contextmanager
    def span(self, message: Any) -> Iterator[Any]:
        api = _api
        headers = message.headers  # decoded before the handler runs (chunks.Chunk.runnable)
        parent = _extracted(api, headers) if headers else None
        links = ()
        if parent is not None and message.field_bytes(REPLAY_OF_FIELD) is not None:
            # A replay runs long after the trace it failed in: its own trace, linked to that one.
            origin = api.trace.get_current_span(parent).get_span_context()
            links = (api.Link(origin, {"shoal.replay_of": message.fields.get("shoal:replay_of", "")}),) \
                if origin.is_valid else ()
            parent = None
        attributes = {
            "messaging.system": SYSTEM, "messaging.destination.name": message.stream,
            "messaging.operation.name": "process", "messaging.operation.type": "process",
            "messaging.message.id": message.id, "messaging.consumer.group.name": message.group or "",
            "messaging.client.id": message.consumer, "shoal.delivery_count": message.deliveries,
        }
        with _get_tracer().start_as_current_span(
                f"process {message.stream}", context=parent, kind=api.CONSUMER, attributes=attributes, links=links,
                record_exception=False, set_status_on_exception=False) as span:
            if message.id in self.taken_over:
                self.taken_over.discard(message.id)
                span.add_event("shoal.takeover", {"shoal.delivery_count": message.deliveries})
            try:
                yield span
            except BaseException as exc:
                self._failed(span, message, exc)
                raise

    def _failed(self, span: Any, message: Any, exc: BaseException) -> None:
        if type(exc).__name__ == "CancelledError":
            # The worker's shutdown cancelled it: the entry stays pending for a takeover, no failure of its own.
            span.add_event("shoal.cancelled")
            return
        span.record_exception(exc, escaped=True)
        cause = exc.__cause__
        if isinstance(exc, RejectMessage) and cause is not None:
            span.record_exception(cause)  # a FAILED task: its own exception, not only the consumer's
        span.set_status(_api.Status(_api.ERROR, f"{type(exc).__name__}: {exc}"))
        if isinstance(exc, RejectMessage) or message.deliveries >= self.max_deliveries:
            span.add_event("shoal.dead_letter", {
                "shoal.dead_letter.stream": self.dead_letter_stream, "shoal.delivery_count": message.deliveries,
                "shoal.dead_letter.reason": "rejected" if isinstance(exc, RejectMessage) else "max_deliveries"})
        else:
            span.add_event("shoal.retry", {"shoal.delivery_count": message.deliveries + 1,
                                           "shoal.retry.delay_s": float(self.retry_in(message.deliveries))})


class _Traced:
    """A sync handler run inside its CONSUMER span; ``begin_chunk`` and ``end_chunk`` (the task runner's
    QueueHandler: a chunk's results written in two round trips) pass through."""

    def __init__(self, tracing: ConsumerTracing, handler: Any) -> None:
        self.tracing, self.handler = tracing, handler
        for name in ("begin_chunk", "end_chunk"):
            found = getattr(handler, name, None)
            if found is not None:
                setattr(self, name, found)

    def __call__(self, message: Any) -> Any:
        with self.tracing.span(message):
            return self.handler(message)


class _TracedAsync(_Traced):
    async def __call__(self, message: Any) -> Any:  # type: ignore[override]
        with self.tracing.span(message):
            return await self.handler(message)


def for_consumer(max_deliveries: int, retry_in: Callable[[int], float],
                 dead_letter_stream: str) -> ConsumerTracing | None:
    """A read loop's ConsumerTracing, or None where opentelemetry is not installed (then the loop never asks)."""
    active()  # imports it, once
    if _missing:
        return None
    return ConsumerTracing(max_deliveries, retry_in, dead_letter_stream)
