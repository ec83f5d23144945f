"""Running the registered handlers in process on captured or hand-built messages (``run_handlers``, ``drain``).

The runner is the consumer's own code, not a copy of it: ``run_chunk_here``/``run_chunk_async_here``
(decoding, poison, replays meant for another group, the shape checks, the idempotency guard) and
``outcomes.dead_lettered`` and ``retry.backoff_seconds`` (what runconsumer retries and when, what it
dead-letters). What differs, so that it runs inside a test: no Redis (the "redis" guard keeps its marks
in memory for the outermost capture), no threads (a sync handler runs in the test's thread, on the
test's database connection and transaction), no sleeping (retries run at once; the back-off
runconsumer would have waited is reported), and nothing is moved to a dead-letter stream (the
report says the message would be).
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import async_to_sync

from streams_app.conf import get_settings
from streams_app.consuming.chunks import run_chunk_async_here, run_chunk_here
from streams_app.consuming.eventloop import FinishInThread
from streams_app.consuming.idempotency import DbGuard, message_key
from streams_app.consuming.outcomes import ChunkResult, dead_lettered, exception_text
from streams_app.consuming.retry import backoff_policy, backoff_seconds
from streams_app.exceptions import ConsumerConfigError
from streams_app.publishing.message import Message
from streams_app.registry import ConsumerSpec, declared
from streams_app.testing.capture import Published, capture_publishes, drained_ids, guard_marks, marks_scope


class Status(enum.Enum):
    HANDLED = "handled"  # the handler ran and returned: acked
    DUPLICATE = "duplicate"  # the idempotency guard had seen its key: acked without running the handler
    SKIPPED = "skipped"  # a dead letter replayed for another group: acked unseen
    FAILED = "failed"  # the last delivery failed and runconsumer would retry it (retry=False, or deliveries left)
    DEAD_LETTERED = "dead-lettered"  # runconsumer would move it to the dead-letter stream


@dataclass
class Delivery:
    """What happened to one message in one group: its last delivery's status, and every failure before it."""

    message: Message  # as the handler received it on the last delivery (group and deliveries set)
    group: str
    handler: str
    status: Status
    errors: list[BaseException] = field(default_factory=list)  # one per failed delivery, in order
    retry_delays: list[float] = field(default_factory=list)  # back-off runconsumer would have waited before each retry
    published: list[Message] = field(default_factory=list)  # what the handler published, every delivery

    @property
    def error(self) -> BaseException | None:
        """The exception of the last failed delivery (None if none failed)."""
        return self.errors[-1] if self.errors else None

    @property
    def deliveries(self) -> int:
        return self.message.deliveries

    @property
    def handled(self) -> bool:
        return self.status is Status.HANDLED

    @property
    def dead_lettered(self) -> bool:
        return self.status is Status.DEAD_LETTERED

    def __str__(self) -> str:
        what = f"{self.message.stream}:{self.group} entry {self.message.id}: {self.status.value}"
        if self.errors:
            what += f" after {self.deliveries} deliveries ({exception_text(self.errors[-1])})"
        return what


class Report(list[Delivery]):
    """The deliveries of a run, in order: per message, one per group that handles it."""

    @property
    def published(self) -> list[Message]:
        """Every message the handlers published, in order (chained publishes)."""
        return [m for delivery in self for m in delivery.published]

    def failures(self) -> list[Delivery]:
        return [d for d in self if d.status in (Status.FAILED, Status.DEAD_LETTERED)]

    def assert_handled(self) -> Report:
        """Raise AssertionError (from the first handler exception) unless every delivery was handled or a duplicate."""
        bad = self.failures()
        if bad:
            raise AssertionError("not handled: " + "; ".join(map(str, bad))) from bad[0].error
        return self


class MemoryGuard:
    """``idempotent="redis"`` without Redis: the same keys (``message_key``); done marks in memory."""

    def __init__(self, spec: ConsumerSpec) -> None:
        self.spec = spec

    def _mark(self, message: Message) -> tuple[str, str, str]:
        return (self.spec.stream, self.spec.group, message_key(message))

    def begin(self, messages: list[Message]) -> tuple[list[Message], list[Message], list[Any]]:
        fresh = [m for m in messages if self._mark(m) not in guard_marks]
        return fresh, [m for m in messages if self._mark(m) in guard_marks], []

    def call(self, handler: Callable[[Message], Any], message: Message) -> bool:
        handler(message)
        return True

    def end(self, succeeded: list[Message], failed: list[Message]) -> None:
        guard_marks.update(self._mark(m) for m in succeeded)


def _guard(spec: ConsumerSpec) -> Any:
    if spec.idempotent == "db":
        return DbGuard()
    if spec.idempotent == "redis":
        return MemoryGuard(spec)
    return None


def _specs(stream: str, group: str | None) -> list[ConsumerSpec]:
    specs = declared(stream, group)
    if not specs:
        where = f"{stream}:{group}" if group else f"stream {stream!r}"
        raise ConsumerConfigError(f"no consumer is registered for {where}; is the module with its @consumer imported?")
    return specs


def _run_once(spec: ConsumerSpec, message: Message) -> tuple[ChunkResult, bool]:
    """One delivery of ``message`` to ``spec``'s handler: (its ChunkResult, whether the handler was called)."""
    called = []
    guard = _guard(spec)
    if spec.is_async:
        async def handler(m: Message) -> Any:
            called.append(True)
            return await spec.handler(m)

        # async_to_sync from this thread: the handler's sync_to_async ORM calls come back to this thread,
        # on the test's database connection (asgiref's thread-sensitive mode).
        result = async_to_sync(run_chunk_async_here)(handler, [message], guard)
        if isinstance(result, FinishInThread):
            result = result.fn()
        return result, bool(called)

    def sync_handler(m: Message) -> Any:
        called.append(True)
        return spec.handler(m)

    return run_chunk_here(sync_handler, [message], guard), bool(called)


def deliver(spec: ConsumerSpec, message: Message, *, retry: bool = True) -> Delivery:
    """Deliver ``message`` to one consumer until it is handled, or dead-lettered (``retry=False``: once)."""
    base, cap = backoff_policy(spec, get_settings())
    deliveries = max(message.deliveries, 1)
    delivery = None
    while True:
        attempt = Message(message.id, spec.stream, spec.group, message.raw_fields, deliveries=deliveries,
                          consumer="testing")
        with capture_publishes() as published:
            result, called = _run_once(spec, attempt)
        if delivery is None:
            delivery = Delivery(attempt, spec.group, spec.handler_path, Status.HANDLED)
        delivery.message = attempt
        delivery.published.extend(published.messages)
        if not result.failed:
            target = attempt.target_group
            delivery.status = (Status.SKIPPED if target is not None and target != spec.group
                               else Status.HANDLED if called else Status.DUPLICATE)
            return delivery
        outcome = result.failed[0]
        delivery.errors.append(outcome.error)
        if dead_lettered(outcome, spec.max_deliveries):
            delivery.status = Status.DEAD_LETTERED
            return delivery
        delivery.status = Status.FAILED
        if not retry:
            return delivery
        delivery.retry_delays.append(backoff_seconds(deliveries, base, cap))
        deliveries += 1


def run_handlers(messages: Message | Iterable[Message], *, stream: str | None = None, group: str | None = None,
                 retry: bool = True) -> Report:
    """Deliver ``messages`` to the registered handlers of their stream, synchronously; report what happened.

    ``stream``: deliver to this stream's handlers (default: each message's own stream, as captured or
    made). ``group``: only that consumer group's handler. Each message goes to each handler as
    runconsumer would deliver it: decoded the same way (poison input is dead-lettered at once), guarded
    (``idempotent="db"`` inside the test's transaction), retried at once up to ``max_deliveries`` (the
    back-off is reported, not slept; ``retry=False`` delivers once) and reported as handled, a
    duplicate, failed (with the exception) or would-be dead-lettered. What the handlers publish is
    captured (``Report.published``, and any capture active around the call). Async handlers run on an
    event loop. Call it from sync code (a sync test); a test that is itself async uses ``sync_to_async``.
    ``idempotent="redis"`` marks last for the outermost capture, or, outside any capture, for this call.
    """
    if isinstance(messages, Message):
        messages = [messages]
    report = Report()
    with marks_scope():
        for message in messages:
            for spec in _specs(stream or message.stream, group):
                report.append(deliver(spec, message, retry=retry))
    return report


def drain(published: Published, *, limit: int = 1000) -> Report:
    """Deliver every message of ``published`` that no drain has delivered yet (of this capture, or of one
    nested in it) to its stream's handlers, then what those handlers publish, and so on until nothing new
    is published: a whole flow, in order.

    Messages to streams that no handler of this project consumes are left alone. ``limit``: at most so
    many messages are delivered (a flow that publishes forever raises RuntimeError instead of hanging).
    """
    with marks_scope():
        return _drain(published, limit)


def _drain(published: Published, limit: int) -> Report:
    report = Report()
    delivered = 0
    while published.drained < len(published.messages):
        message = published.messages[published.drained]
        published.drained += 1
        if message.id in drained_ids or not declared(message.stream):
            continue
        drained_ids.add(message.id)
        delivered += 1
        if delivered > limit:
            raise RuntimeError(f"drain() delivered {limit} messages and the handlers keep publishing; "
                               "a loop between handlers? Raise limit= if the flow is that long.")
        run = run_handlers(message)
        if not published.active:  # an active capture recorded the chained publishes itself
            published.messages.extend(run.published)
        report.extend(run)
    return report
