"""Capturing what code publishes, in process and without Redis (``capture_publishes``).

While a capture is active, ``publish``, ``publish_many`` and ``publish(..., outbox=True)`` validate
and encode their input as always, then hand the entries to this module through the producer's one
seam (``streams_app.publishing.producer.set_publish_hook``) instead of Redis or the outbox table. Direct
publishes are recorded at once; outbox publishes when their transaction commits, as the relay would
see them (``transaction.on_commit``: in a ``TestCase``, inside ``self.captureOnCommitCallbacks(execute=True)``).
"""
from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from django.db import transaction

from streams_app.publishing import producer
from streams_app.publishing.message import Message
from streams_app.testing.messages import as_stored, new_entry_id

_lock = threading.RLock()
_active: list[Published] = []
_previous_hook: list[Any] = []
# The in-memory done marks of idempotent="redis" handlers run in process (testing.handlers.MemoryGuard):
# they last as long as the outermost capture, as a test; outside any capture, one run_handlers/drain call
# (marks_scope), not one delivery (each delivery captures its handler's publishes).
guard_marks: set[tuple[str, str, str]] = set()
_scopes = [0]  # run_handlers/drain calls in progress (marks_scope)
# The ids of the messages some drain() has delivered: nested captures record the same message (the same
# id) each, and an outer drain must not deliver again what an inner one did. Cleared with guard_marks.
drained_ids: set[str] = set()


class Published:
    """The messages published while a capture was active, in the order they were published.

    Each is a ``Message`` read back as a consumer would read it: ``.payload`` decoded (typed values
    included), ``.key``, ``.headers``, ``.stream``, ``.id``; ``.group`` is None until a handler runs it.
    """

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.active = False
        self.drained = 0  # how many of ``messages`` streams_app.testing.drain() has delivered

    def __iter__(self) -> Iterator[Message]:
        return iter(list(self.messages))

    def __len__(self) -> int:
        return len(self.messages)

    def __repr__(self) -> str:
        return f"<Published {len(self.messages)} message(s) on {self.streams}>"

    @property
    def streams(self) -> list[str]:
        """The streams published to, in order of their first message."""
        return list(dict.fromkeys(m.stream for m in self.messages))

    def on(self, stream: str) -> list[Message]:
        """The messages published to ``stream``, in order."""
        return [m for m in self.messages if m.stream == stream]

    def payloads(self, stream: str) -> list[Any]:
        """The decoded payloads published to ``stream``, in order."""
        return [m.payload for m in self.on(stream)]

    def clear(self) -> None:
        self.messages.clear()
        self.drained = 0

    def record(self, stream: str, entries: Sequence[Mapping[str, Any]], ids: list[str]) -> None:
        with _lock:
            self.messages.extend(Message(entry_id, stream, None, as_stored(fields), deliveries=0)
                                 for entry_id, fields in zip(ids, entries))


def _hook(stream: str, entries: list[dict[str, Any]], using: str | None) -> list[str]:
    ids = [new_entry_id() for _ in entries]
    targets = list(_active)
    if using is None:
        _record(targets, stream, entries, ids)
    else:  # the relay sends a row only once its transaction has committed
        transaction.on_commit(partial(_record, targets, stream, entries, ids), using=using)
    return ids


def _record(targets: list[Published], stream: str, entries: list[dict[str, Any]], ids: list[str]) -> None:
    for published in targets:
        published.record(stream, entries, ids)


@contextmanager
def capture_publishes() -> Iterator[Published]:
    """Record every publish made inside the block instead of sending it; yields the ``Published`` record.
    For example:

        with capture_publishes() as published:
            client.post("/orders/", {...})
        assert published.payloads("orders") == [{"order_id": 1}]

    Captures nest: each active one records what is published while it is active. Nothing reaches
    Redis and none is needed. PublishError for bad input is raised as in production.
    """
    published = Published()
    with _lock:
        if not _active:
            if not _scopes[0]:  # not a capture run_handlers makes around one delivery
                guard_marks.clear()
                drained_ids.clear()
            _previous_hook.append(producer.set_publish_hook(_hook))
        _active.append(published)
        published.active = True
    try:
        yield published
    finally:
        with _lock:
            _active.remove(published)
            published.active = False
            if not _active:
                producer.set_publish_hook(_previous_hook.pop())


@contextmanager
def marks_scope() -> Iterator[None]:
    """Around a run_handlers/drain call: outside any capture, the call starts with no idempotency marks and
    keeps them to its end (inside one, the outermost capture holds them)."""
    with _lock:
        if not _active and not _scopes[0]:
            guard_marks.clear()
        _scopes[0] += 1
    try:
        yield
    finally:
        with _lock:
            _scopes[0] -= 1


def capturing() -> bool:
    """True while some capture is active (publishes go nowhere but the capture)."""
    return bool(_active)
