"""The handler of a queue's async consumer (``tasks:Q:async``, on the worker's event loop): each task is
awaited on the loop, its Redis writes and signals run in a thread.

``run_message_async`` alone costs three thread hops and two round trips per task, which held ``async
def`` tasks that wait 1 ms to a tenth of what an async ``@consumer`` doing the same runs. An async
consumer hands each message to a coroutine of its own (no chunks: they would await their messages one
after the other), so AsyncQueueHandler batches across coroutines instead: a task's RUNNING, and then
its SUCCESSFUL, join those of the other tasks of the loop written at that moment, in one thread hop
and one round trip (a group commit, GroupWrite). A task waits for its own start to be written before
it runs, and for its success to be written before its entry is acked, as one by one. A failure is
written at once, alone, as ever. What QueueHandler's docstring says is not batched is not batched here
either (a task that takes its context, a receiver of task_started or task_finished, a result not
created yet, an idempotency guard, a cluster): those run through run_message_async. A worker killed
leaves the entries pending and their results RUNNING, taken over and run again, as for a sync task.
"""
import asyncio

from asgiref.sync import iscoroutinefunction

from streams_app import tracing
from streams_app.exceptions import RejectMessage
from streams_app.tasks import counting, results, retries, timelimits
from streams_app.tasks.api import task_finished, task_started
from streams_app.tasks.runner import (
    Attempt, Cancelled, StartFailed, deferrable, encode_return, log_state, logger, now_iso, write_successes,
)


async def run_message_async(alias, message):
    """One task message on its own: the Redis writes and signals in a thread, the task awaited on the loop."""
    attempt = await asyncio.to_thread(Attempt, alias, message)
    try:
        args, kwargs = await asyncio.to_thread(attempt.start)
    except Cancelled:
        return
    except StartFailed as failure:
        await _failed(attempt, failure.exc, failure.exc)
        return
    seconds = retries.timeout(attempt.task, attempt.config)
    limit = asyncio.timeout(seconds)  # None: no limit
    try:
        async with limit:  # past it the task is cancelled, and the block raises TimeoutError
            value = await _call(attempt.task.func, args, kwargs)
        await asyncio.to_thread(attempt.succeeded, value)
    except asyncio.CancelledError:
        raise  # the worker's shutdown (or the task's own cancel): the consumer decides, the entry stays pending
    except RejectMessage:
        raise
    except BaseException as raised:  # noqa: BLE001
        # limit.expired(): the TimeoutError is ours, not one of the task's own (a socket's, say).
        await _failed(attempt, timelimits.timeout_error(attempt, seconds) if limit.expired() else raised, raised)


async def _call(func, args, kwargs):
    # A sync function here was enqueued while it was async: it runs in a thread, off the loop.
    return await func(*args, **kwargs) if iscoroutinefunction(func) else await asyncio.to_thread(func, *args, **kwargs)


async def _failed(attempt, exc, raised):
    """Record the attempt's failure (in a thread) and do what Attempt.failed says: return (the entry is
    done: retried as a deferred message), or raise for the consumer."""
    outcome = await asyncio.to_thread(attempt.failed, exc)
    if outcome is None:
        return
    if outcome is exc:  # the consumer retries the entry itself
        raise exc from (raised if exc is not raised else None)
    raise outcome from exc


class AsyncQueueHandler:
    """The handler streams_app.tasks.setup registers for a queue's async consumer (see the module)."""

    shoal_handler_name = ""  # the Handler the admin shows (registry.describe_handler); set by setup.install

    def __init__(self, alias):
        self.alias = alias
        self.starts = GroupWrite(_start_many)
        self.successes = GroupWrite(_succeed_many)

    async def __call__(self, message):
        try:
            # On the loop: the message's parsing and the task's lookup touch no Redis (refuse=False).
            attempt = Attempt(self.alias, message, refuse=False)
        except Exception:  # noqa: BLE001 -- refused or broken: the one-by-one path refuses it, and says why
            return await run_message_async(self.alias, message)
        if (attempt.task.takes_context or not deferrable(attempt) or attempt.listened(task_started)
                or attempt.listened(task_finished)):
            return await run_message_async(self.alias, message)
        try:
            number, errors = await self.starts(attempt)
        except Exception:  # noqa: BLE001 -- Redis refused: the one-by-one start meets it and says why
            logger.debug("Could not start task %s with others in one round trip", attempt.data["id"], exc_info=True)
            number = errors = 0
        if not number:  # no result to start (written after an outbox commit, or expired), or cancelled
            return await run_message_async(self.alias, message)
        attempt.number, attempt.errors_so_far = number, errors
        attempt.counted(counting.started)
        log_state(attempt, "RUNNING")
        data = attempt.data
        tracing.task_run(data["task"], str(data["id"]))
        seconds = retries.timeout(attempt.task, attempt.config)
        limit = asyncio.timeout(seconds)
        started = now_iso()
        try:
            async with limit:
                value = await _call(attempt.task.func, data["args"], data["kwargs"])
            value = encode_return(value)
        except asyncio.CancelledError:
            raise  # the worker's shutdown: the entry stays pending, its result RUNNING, run again
        except RejectMessage:
            raise
        except BaseException as raised:  # noqa: BLE001 -- the consumer's rule: every exception is the task's failure
            await _failed(attempt, timelimits.timeout_error(attempt, seconds) if limit.expired() else raised, raised)
            return
        problem = await self.successes((attempt, started, now_iso(), value))
        if problem is not None:
            raise problem  # not written: the entry is not acked, and its task runs again


def _start_many(attempts):
    """results.started_many of ``attempts``, one round trip per consumer among them (a worker's loops
    share one name: one); (attempt number, errors so far) of each, (0, 0) where nothing was started."""
    by_consumer = {}
    for position, attempt in enumerate(attempts):
        by_consumer.setdefault(attempt.message.consumer, []).append(position)
    started = [None] * len(attempts)
    for consumer, positions in by_consumer.items():
        replies = results.started_many(attempts[0].conn, [attempts[i].data["id"] for i in positions], consumer,
                                       [attempts[i].config["RESULT_TTL"] for i in positions])
        for position, reply in zip(positions, replies):
            started[position] = reply
    return started


def _succeed_many(done):
    """SUCCESSFUL of each (attempt, started_at, finished_at, return JSON) of ``done`` in one round trip;
    per entry, None, or the exception that kept it from being written."""
    failed = {id(message): exc for message, exc in write_successes(done)}
    return [failed.get(id(attempt.message)) for attempt, *_ in done]


class GroupWrite:
    """One write, in a thread, for the calls of many coroutines of one event loop: those made while a
    write is under way (or in the same pass of the loop) go together in the next one. Under load a
    write carries as many tasks as finish together; alone, a call costs one write, as before.

    ``write(items)`` returns one outcome per item; a call returns its item's, or raises what ``write``
    raised. Only the event loop's thread calls it."""

    def __init__(self, write):
        self.write = write
        self.waiting = []  # (item, future) for the next write
        self.loop = None
        self.flusher = None  # the task writing, while one is

    async def __call__(self, item):
        loop = asyncio.get_running_loop()
        if self.flusher is not None and self.loop is not loop:  # another loop (a test's async_to_sync) writes alone
            return (await asyncio.to_thread(self.write, [item]))[0]
        future = loop.create_future()
        self.waiting.append((item, future))
        if self.flusher is None:
            self.loop, self.flusher = loop, loop.create_task(self._flush())
        return await future

    async def _flush(self):
        batch = []
        try:
            while self.waiting:
                await asyncio.sleep(0)  # the calls of this pass of the loop join the write
                batch, self.waiting = self.waiting, []
                try:
                    outcomes = await asyncio.to_thread(self.write, [item for item, _ in batch])
                except Exception as exc:  # noqa: BLE001 -- each caller raises it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for (_, future), outcome in zip(batch, outcomes):
                        if not future.done():
                            future.set_result(outcome)
                batch = []
        except BaseException:  # cancelled: the loop is stopping; no caller is left waiting for a write
            for _, future in batch + self.waiting:
                if not future.done():
                    future.set_exception(RuntimeError("the event loop stopped before this task's result was written"))
            self.waiting = []
            raise
        finally:
            self.flusher = None
