"""``ShoalTestMixin``: capture_publishes and the in-process runner for Django's own test runner."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streams_app.publishing.message import Message
from streams_app.testing.capture import Published, capture_publishes
from streams_app.testing.handlers import Report, drain, run_handlers


class ShoalTestMixin:
    """Mix into a ``django.test.TestCase`` (or ``SimpleTestCase``): every test runs inside ``capture_publishes()``.

    ``self.published`` is the capture; ``self.run_handlers(...)`` and ``self.drain()`` run the handlers.
    Outbox publishes are recorded when their transaction commits: in a TestCase, wrap the code in
    ``with self.captureOnCommitCallbacks(execute=True):``.
    """

    published: Published

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        capture = capture_publishes()
        self.published = capture.__enter__()
        self.addCleanup(capture.__exit__, None, None, None)  # type: ignore[attr-defined]

    def run_handlers(self, messages: Message | Iterable[Message], **options: Any) -> Report:
        return run_handlers(messages, **options)

    def drain(self, **options: Any) -> Report:
        return drain(self.published, **options)
