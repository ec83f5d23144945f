"""Issue 44: the async consumer's handler (tasks/awaiting.py AsyncQueueHandler) writes the starts and the
successes of the tasks running together on the event loop in one round trip each (GroupWrite). On one
redis-server: on a cluster each task is written on its own (test_backend.py)."""
import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync

from shoal_common.redisconn import is_cluster
from streams_app.publishing.message import Message
from streams_app.tasks import results
from streams_app.tasks.awaiting import AsyncQueueHandler, GroupWrite
from streams_app.tasks.cancelling import cancel

pytestmark = pytest.mark.django_db

STREAM = "tasks:default:async"


@pytest.fixture(autouse=True)
def one_server(redis):
    if is_cluster(redis):
        pytest.skip("on a cluster each task is written on its own")


def delivered(redis, consumer="worker-1"):
    return [Message(entry_id, STREAM, "workers", fields, deliveries=1, consumer=consumer)
            for entry_id, fields in redis.xrange(STREAM)]


def evalsha(redis):
    return redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


def run_together(handler, messages):
    """The handler on every message at once on one event loop, as the worker's loop runs them; each
    message's outcome (None, or what it raised)."""
    async def everything():
        return await asyncio.gather(*(handler(message) for message in messages), return_exceptions=True)

    return async_to_sync(everything)()


def test_tasks_running_together_start_and_succeed_in_one_round_trip_each(jobs, redis):
    jobs.async_add.enqueue(0, 0)
    handler = AsyncQueueHandler("default")
    run_together(handler, delivered(redis))  # loads the scripts
    ids = [jobs.async_add.enqueue(n, 1).id for n in range(20)]
    before = evalsha(redis)
    outcomes = run_together(handler, delivered(redis)[1:])
    assert outcomes == [None] * 20
    assert evalsha(redis) - before == 2  # one run_message_async each would be 40
    for n, result_id in enumerate(ids):
        stored = jobs.async_add.get_result(result_id)
        assert (stored.status, stored.return_value["sum"], stored.worker_ids) == ("SUCCESSFUL", n + 1, ["worker-1"])
        assert stored.attempts == 1
        assert stored.enqueued_at <= stored.started_at <= stored.last_attempted_at <= stored.finished_at


def test_a_failure_among_them_is_written_at_once_and_the_rest_succeed(jobs, redis):
    good = [jobs.async_add.enqueue(n, n) for n in range(3)]
    bad = jobs.async_add.enqueue("a", 1)  # "a" + 1 raises TypeError in the task
    outcomes = run_together(AsyncQueueHandler("default"), delivered(redis))
    assert outcomes[:3] == [None] * 3
    assert "FAILED" in str(outcomes[3]) and "TypeError" in str(outcomes[3])  # RejectMessage: dead-lettered
    assert [jobs.async_add.get_result(r.id).status for r in good] == ["SUCCESSFUL"] * 3
    failed = jobs.async_add.get_result(bad.id)
    assert failed.status == "FAILED" and failed.errors[0].exception_class_path == "builtins.TypeError"


def test_successes_that_cannot_be_written_raise_so_their_entries_are_not_acked(jobs, redis):
    result = jobs.async_wait.enqueue(0.2)
    handler = AsyncQueueHandler("default")
    [message] = delivered(redis)

    async def full_while_it_runs():
        running = asyncio.ensure_future(handler(message))
        while results.get(redis, result.id)["status"] != "RUNNING":  # noqa: ASYNC110 -- a test's poll
            await asyncio.sleep(0.01)
        redis.config_set("maxmemory-policy", "noeviction")
        redis.config_set("maxmemory", "1")
        try:
            return await asyncio.gather(running, return_exceptions=True)
        finally:
            redis.config_set("maxmemory", "0")

    [raised] = async_to_sync(full_while_it_runs)()
    assert "maxmemory" in str(raised)
    assert results.get(redis, result.id)["status"] == "RUNNING"  # not acked: taken over and run again


def test_a_cancelled_task_is_not_awaited_and_a_missing_result_is_written(jobs, redis):
    cancelled, missing = jobs.async_add.enqueue(1, 2), jobs.async_add.enqueue(3, 4)
    cancel(cancelled.id)
    redis.delete(results.key(missing.id))  # as an outbox enqueue whose READY is written after the commit
    outcomes = run_together(AsyncQueueHandler("default"), delivered(redis))
    assert outcomes == [None, None]
    assert jobs.async_add.get_result(cancelled.id).status == "FAILED"  # cancel's own record, never RUNNING
    assert results.get(redis, cancelled.id)["started_at"] is None
    assert jobs.async_add.get_result(missing.id).return_value["sum"] == 7


def test_a_group_write_gathers_the_calls_made_while_one_is_under_way():
    writes, writing, release = [], threading.Event(), threading.Event()

    def write(items):
        writes.append(list(items))
        writing.set()
        assert release.wait(10)
        return [item * 10 for item in items]

    group = GroupWrite(write)

    async def calls():
        first = asyncio.ensure_future(group(1))
        while not writing.is_set():  # noqa: ASYNC110 -- the first write is under way in its thread
            await asyncio.sleep(0.001)
        rest = asyncio.gather(*(group(n) for n in (2, 3, 4)))
        await asyncio.sleep(0.01)
        release.set()
        return [await first, *await rest]

    assert async_to_sync(calls)() == [10, 20, 30, 40]
    assert writes == [[1], [2, 3, 4]]


def test_a_group_write_that_raises_raises_in_every_caller_and_the_next_write_goes_on():
    calls = []

    def write(items):
        calls.append(items)
        if len(calls) == 1:
            raise ConnectionError("Redis went away")
        return list(items)

    group = GroupWrite(write)

    async def twice():
        first = await asyncio.gather(group("a"), group("b"), return_exceptions=True)
        return first, await group("c")

    (first, second) = async_to_sync(twice)()
    assert [type(e) for e in first] == [ConnectionError, ConnectionError] and second == "c"
