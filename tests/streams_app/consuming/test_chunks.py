"""run_chunk and run_chunk_async in-process: what a handler does becomes an outcome, never an escape."""
import asyncio
import warnings

import pytest

from streams_app.consuming.chunks import run_chunk, run_chunk_async
from streams_app.consuming.eventloop import cancel_for_shutdown
from streams_app.consuming.outcomes import Status, exception_text
from streams_app.exceptions import HandlerShapeError
from streams_app.testing import make_message

pytestmark = pytest.mark.django_db  # the runners close stale database connections


def message(n, payload=None):
    return make_message(payload or {}, stream="chunks-test", group="g", id=f"1-{n}")


class BadStr(Exception):
    def __str__(self):
        raise AttributeError("no order_id")


class BadBoth(BadStr):
    def __repr__(self):
        raise AttributeError("nor this")


def raising(kind):
    def handler(message):
        raise kind()
    return handler


@pytest.mark.parametrize("kind", [SystemExit, KeyboardInterrupt, GeneratorExit, BadStr, ValueError])
def test_whatever_a_sync_handler_raises_is_a_failed_outcome(kind):
    result = run_chunk(raising(kind), [message(1)])
    [outcome] = result.failed
    assert result.acked == [] and outcome.status is Status.FAILED and type(outcome.error) is kind


@pytest.mark.parametrize("kind", [SystemExit, KeyboardInterrupt, GeneratorExit, asyncio.CancelledError, BadStr])
def test_whatever_an_async_handler_raises_is_a_failed_outcome(kind):
    async def handler(message):
        raise kind()

    result = asyncio.run(run_chunk_async(handler, [message(1), message(2)]))
    assert result.acked == [] and [type(o.error) for o in result.failed] == [kind, kind]


def test_async_chunk_cancelled_by_the_worker_acks_nothing():
    async def main():
        started = asyncio.Event()

        async def handler(message):
            started.set()
            await asyncio.sleep(60)

        task = asyncio.create_task(run_chunk_async(handler, [message(1)]))
        await started.wait()
        cancel_for_shutdown(task)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_a_cancel_that_did_not_come_from_the_worker_fails_the_message():
    async def main():
        async def handler(message):
            asyncio.current_task().cancel()
            await asyncio.sleep(60)

        return await run_chunk_async(handler, [message(1)])

    result = asyncio.run(main())
    [outcome] = result.failed
    assert result.acked == [] and type(outcome.error).__name__ == "HandlerCancelledError"


def test_a_sync_handler_returning_a_coroutine_or_generator_fails_without_a_never_awaited_warning():
    async def body(message):
        raise AssertionError("never runs")

    def gen(message):
        yield

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would fail the test
        coro = run_chunk(lambda m: body(m), [message(1)])
        generator = run_chunk(lambda m: gen(m), [message(2)])
    assert isinstance(coro.failed[0].error, HandlerShapeError) and "returned an awaitable" in str(coro.failed[0].error)
    assert isinstance(generator.failed[0].error, HandlerShapeError) and "generator" in str(generator.failed[0].error)
    assert coro.acked == generator.acked == []


def test_describing_an_exception_never_raises():
    assert exception_text(ValueError("x")) == "ValueError: x"
    assert exception_text(BadStr()) == "BadStr (str() failed): BadStr()"
    assert exception_text(BadBoth()) == "BadBoth (str() and repr() failed)"


def test_async_chunks_count_and_time_their_messages_like_sync_ones():
    from prometheus_client import REGISTRY

    labels = {"stream": "chunks-test", "group": "g"}

    def value(name, **extra):
        return REGISTRY.get_sample_value(name, {**labels, **extra}) or 0.0

    before = (value("shoal_messages_handled_total"), value("shoal_messages_failed_total", reason="error"),
              value("shoal_handler_duration_seconds_count"), value("shoal_handler_duration_seconds_sum"))

    async def handler(message):
        await asyncio.sleep(0.02)
        if message.payload.get("fail"):
            raise ValueError("asked to")

    asyncio.run(run_chunk_async(handler, [message(1), message(2, {"fail": 1})]))
    after = (value("shoal_messages_handled_total"), value("shoal_messages_failed_total", reason="error"),
             value("shoal_handler_duration_seconds_count"), value("shoal_handler_duration_seconds_sum"))
    assert [a - b for a, b in zip(after[:3], before[:3])] == [1, 1, 2]
    assert after[3] - before[3] >= 0.04  # the awaits are handler time
    assert value("shoal_messages_in_flight") == 0
