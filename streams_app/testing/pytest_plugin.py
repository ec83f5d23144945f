"""pytest fixtures for projects that use Shoal. Installed with django-shoal as a pytest plugin (entry point
``shoal``); in a checkout, or to be explicit: ``pytest_plugins = ["streams_app.testing.pytest_plugin"]``.

- ``shoal_published``: the test runs inside ``capture_publishes()``; the fixture is its ``Published``.

The helpers are imported inside the fixtures, so loading the plugin touches neither Django nor Redis.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from streams_app.testing.capture import Published


@pytest.fixture
def shoal_published() -> Iterator[Published]:
    """Every publish the test makes is recorded here instead of sent; no Redis is needed."""
    from streams_app.testing.capture import capture_publishes

    with capture_publishes() as published:
        yield published
