"""pytest fixtures for projects that use Shoal. Not loaded by itself (django-shoal declares no pytest11
entry point, so installing it changes no other project's test run): add
``pytest_plugins = ["streams_app.testing.pytest_plugin"]`` to the top-level ``conftest.py``.

- ``shoal_published``: the test runs inside ``capture_publishes()``; the fixture is its ``Published``.
- ``shoal_redis``: real-Redis mode; Django's Redis points at a private redis-server (started once per
  session on a free port, or the one ``SHOAL_TEST_REDIS_URL`` names), flushed before and after the test.
  It is a ``TestRedis``: ``.url`` for a ``runconsumer --burst`` subprocess, ``.client()``.

The helpers are imported inside the fixtures, so loading the plugin touches neither Django nor Redis.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from streams_app.testing.capture import Published
    from streams_app.testing.redis_server import TestRedis


@pytest.fixture
def shoal_published() -> Iterator[Published]:
    """Every publish the test makes is recorded here instead of sent; no Redis is needed."""
    from streams_app.testing.capture import capture_publishes

    with capture_publishes() as published:
        yield published


@pytest.fixture(scope="session")
def shoal_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestRedis]:
    """One private redis-server for the session (or the Redis ``SHOAL_TEST_REDIS_URL`` names)."""
    from streams_app.testing.redis_server import TestRedis

    server = TestRedis(tmp_path_factory.mktemp("shoal-redis"))
    try:
        server.start()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


@pytest.fixture
def shoal_redis(shoal_redis_server: TestRedis, settings: Any) -> Iterator[TestRedis]:
    """Real-Redis mode: Django's Redis cache (``STREAMS["REDIS_ALIAS"]``) points at the test Redis, empty
    before and after the test. Needs pytest-django (its ``settings`` fixture)."""
    from streams_app.conf import setting

    alias = setting("REDIS_ALIAS")
    settings.CACHES = {**settings.CACHES, alias: {**settings.CACHES[alias], "LOCATION": shoal_redis_server.url}}
    shoal_redis_server.flush()
    yield shoal_redis_server
    shoal_redis_server.flush()
