"""Running a handler on a chunk of messages: sync handlers in a handler thread, async ones on the
worker's event loop (streams_app.consuming.eventloop). Both share one bookkeeping class, so an async
handler is acked, retried, dead-lettered and timed exactly like a sync one.

Whatever a handler raises is a failure of its message, never an escape: ``Exception`` and every
``BaseException`` alike (``SystemExit`` from a library's ``sys.exit()``, ``KeyboardInterrupt``,
``GeneratorExit``), so each obeys max_deliveries and none kills or wedges the worker. A handler
thread never receives the interpreter's own signals (Python delivers them to the main thread,
where the worker handles SIGTERM/SIGINT itself), so such an exception always came from handler
code. The one exception passed through is ``asyncio.CancelledError`` while the worker itself is
cancelling the chunk at the end of the shutdown timeout: that entry stays pending for takeover. A
cancel the handler brought on itself (``asyncio.current_task().cancel()``) is its failure.
"""
import asyncio
import functools
import inspect
import logging
import time

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from shoal_common.logsummary import RepeatSummary
from streams_app.consuming import alone
from streams_app.consuming.runs import RunsNotRecorded
from streams_app.consuming.outcomes import ChunkResult, Outcome, Status, exception_text
from streams_app.consuming.eventloop import FinishInThread, cancelled_by_shutdown
from streams_app.exceptions import HandlerCancelledError, HandlerShapeError, PayloadDecodeError, RejectMessage
from streams_app.metrics import consumer as metrics

logger = logging.getLogger("streams_app.consumer")
# Per stream, group and error type: the first failures of each interval, then a count.
failure_log = RepeatSummary(logger)


class Chunk:
    """The bookkeeping of one chunk: what to run, what succeeded or failed, the guard, the metrics.

    ``budget`` (seconds): once a chunk has run that long it starts no further message and hands
    the rest back. Chunks are sized from past handler speed; when handlers slow down, a big chunk
    would otherwise hold finished entries unacked until another consumer's takeover (after the
    pending timeout) handled them a second time.
    """

    def __init__(self, messages, guard, budget):
        self.messages = messages
        self.guard = guard
        self.budget = budget
        self.recorder = metrics.chunk_started(messages)
        self.started = time.perf_counter()
        self.result = ChunkResult()
        self.succeeded = []
        self.errored = []

    def runnable(self):
        """The messages to hand to the handler: replays for other groups are acked, poison fails."""
        runnable = []
        for message in self.messages:
            target = message.target_group
            if target is not None and target != message.group:
                # A dead letter replayed for another group: this group handled it the first time.
                self.result.acked.append(message.id)
                continue
            try:
                # Decode before the handler runs, so poison input is found even if the handler
                # would never have looked at the payload.
                message.decode()
            except PayloadDecodeError as exc:
                logger.error("Consumer %s: entry %s on %s is poison: %s", message.consumer, message.id, message.stream, exc)
                self.result.failed.append(Outcome(message, Status.POISON, exc))
                continue
            runnable.append(message)
        return runnable

    def admit(self, runnable):
        """Ask the idempotency guard which messages to run (a Redis round trip for the "redis" guard)."""
        if self.guard is None or not runnable:
            return runnable
        try:
            runnable, duplicates, busy = self.guard.begin(runnable)
        except BaseException:
            self.abandon()  # the chunk fails whole; the loop counts a failed delivery for each message
            raise
        self.result.acked.extend(m.id for m in duplicates)
        self.result.failed.extend(Outcome(m, Status.FAILED, exc) for m, exc in busy)
        return runnable

    def out_of_time(self, index):
        return self.budget is not None and index and time.perf_counter() - self.started > self.budget

    def ran(self, message):
        self.result.acked.append(message.id)
        self.succeeded.append(message)

    def end(self, handler):
        """A handler that writes part of its effect per chunk (``handler.end_chunk()``, the task
        runner's QueueHandler: a task's SUCCESSFUL result) writes it now, in the handler's thread and
        before anything is acked. Each (message, exception) it returns is a failure, not an ack."""
        end_chunk = getattr(handler, "end_chunk", None)
        if end_chunk is None:
            return
        for message, exc in end_chunk():
            if message.id in self.result.acked:
                self.result.acked.remove(message.id)
            if message in self.succeeded:
                self.succeeded.remove(message)
            self.failed(message, exc)

    def duplicate(self, message):
        logger.info("Consumer %s: entry %s of %s/%s is a duplicate; acked without running the handler",
                    message.consumer, message.id, message.stream, message.group)
        self.result.acked.append(message.id)

    def failed(self, message, exc):
        kind = type(exc).__name__
        failure_log.log(
            logging.WARNING, (message.stream, message.group, kind),
            f"handler failures ({kind}) on {message.stream} (group {message.group})",
            "Consumer %s: handler failed on entry %s of %s (group %s, delivery %s): %s",
            message.consumer, message.id, message.stream, message.group, message.deliveries,
            exception_text(exc), exc_info=logger.isEnabledFor(logging.DEBUG),
            extra={"stream": message.stream, "group": message.group},
        )
        status = Status.REJECTED if isinstance(exc, RejectMessage) else Status.FAILED
        self.result.failed.append(Outcome(message, status, exc))
        self.errored.append(message)

    def end_guard(self):
        if self.guard is None:
            return
        try:
            self.guard.end(self.succeeded, self.errored)
        except Exception as exc:
            # The handlers ran: ack them all the same. Without the done mark a later duplicate
            # delivery may run again, which the "redis" guard never promised to prevent.
            first = self.messages[0]
            logger.warning("Consumer %s: could not record %d handled entries of %s/%s in the idempotency guard: %s",
                           first.consumer, len(self.succeeded), first.stream, first.group, exception_text(exc))

    def close(self, left=()):
        """Record the chunk's metrics and return its ChunkResult. Never raises: the handlers ran."""
        elapsed = time.perf_counter() - self.started
        done = len(self.messages) - len(left)
        result = self.result
        result.left = list(left)
        result.seconds_per_message = elapsed / max(done, 1)
        try:
            self.recorder.finished(done, len(result.acked), result.failed, elapsed)
            if left:
                self.recorder.in_flight.dec(len(left))
        except Exception:
            logger.exception("Consumer %s: could not record the metrics of a chunk", self.messages[0].consumer)
        return result

    def abandon(self):
        """The chunk ends without a result (a guard's error, a cancel at shutdown)."""
        self.recorder.in_flight.dec(len(self.messages))


# -- sync handlers, in a handler thread ----------------------------------------------------------

def _started(chunk, runs):
    """Record the chunk as running before anything of it runs (runs.RunLedger; raises RunsNotRecorded)."""
    if runs is not None:
        try:
            runs.started(chunk.messages, alone=alone.holding())
        except BaseException:
            chunk.abandon()
            raise
        chunk.started = time.perf_counter()  # chunk sizes follow handler time, not this round trip


def _finished(result, runs, messages, suspect=None):
    """Off the running record now, from this thread: a death of the process later does not charge it.
    ``suspect``: the chunk is a suspect's run (alone.suspect_run(), asked where the chunk ran)."""
    if runs is not None:
        runs.finished(result, messages, suspect=alone.suspect_run() if suspect is None else suspect)
    return result


def run_suspect(run, *args):
    """``run(*args)`` (run_chunk on a chunk of one suspect: an entry that was running when a worker died,
    taken over from it) alone in the process (alone.py), so a death then is charged to it only."""
    return alone.gate.run_alone(run, *args)


async def run_suspect_async(run, *args):
    """``run_suspect`` for an ``async def`` handler: waits for its turn in a thread, off the event loop."""
    return await alone.gate.run_alone_async(run, *args)


def run_chunk(handler, messages, guard=None, budget=None, runs=None):
    """Run the sync ``handler`` on each message in this thread; return a ChunkResult.

    ``guard`` (streams_app.consuming.idempotency) skips duplicates. ``runs`` (runs.RunLedger)
    charges the deliveries when the chunk starts and acks when it ends.
    """
    close_old_connections()
    result = run_chunk_here(handler, messages, guard, budget, runs)
    close_old_connections()
    return result


def run_chunk_here(handler, messages, guard=None, budget=None, runs=None):
    """``run_chunk`` on the caller's database connection as it stands: no stale-connection check,
    which would close a test's connection and its transaction (streams_app.testing runs handlers so)."""
    if not alone.gate.enter():  # not beside a suspect (alone.py); False: this is the suspect
        return _run_chunk_here(handler, messages, guard, budget, runs)
    acked = False
    try:
        result = _run_chunk_here(handler, messages, guard, budget, runs)
        acked = runs is not None and bool(result.acked)
        return result
    finally:
        alone.gate.leave(acked)


def _run_chunk_here(handler, messages, guard, budget, runs):
    chunk = Chunk(messages, guard, budget)
    runnable = chunk.admit(chunk.runnable())
    _started(chunk, runs)  # after the guard's admission, which runs no handler (nor charges one at maxmemory)
    if guard is None:
        begin_chunk = getattr(handler, "begin_chunk", None)
        if begin_chunk is not None and runnable:  # the task runner's QueueHandler: the chunk's results RUNNING at once
            begin_chunk(runnable)
        left = _run_unguarded(handler, chunk, runnable)
        chunk.end(handler)
        return _finished(chunk.close(left), runs, messages)
    call = _checked(handler)
    left = []
    for index, message in enumerate(runnable):
        if chunk.out_of_time(index):
            left = runnable[index:]
            break
        try:
            if guard is None:
                call(message)
            elif not guard.call(call, message):
                chunk.duplicate(message)
                continue
        except BaseException as exc:  # see the module docstring: every exception obeys max_deliveries
            chunk.failed(message, exc)
        else:
            chunk.ran(message)
    chunk.end(handler)
    chunk.end_guard()
    return _finished(chunk.close(left), runs, messages)


def _run_unguarded(handler, chunk, runnable):
    """run_chunk's loop without a guard (the default), with no per-message call besides the handler's:
    the same budget check, shape check and bookkeeping as Chunk.out_of_time, _checked and Chunk.ran.
    Returns the messages left unstarted."""
    budget, started, clock = chunk.budget, chunk.started, time.perf_counter
    acked = chunk.result.acked
    for index, message in enumerate(runnable):
        if budget is not None and index and clock() - started > budget:
            return runnable[index:]
        try:
            result = handler(message)
            if result is not None:
                reason = _did_not_run(result)
                if reason:
                    raise HandlerShapeError(reason)
        except BaseException as exc:  # see the module docstring: every exception obeys max_deliveries
            chunk.failed(message, exc)
        else:
            acked.append(message.id)  # Chunk.ran; ``succeeded`` is for the guard only
    return []


def _checked(handler):
    """``handler`` called so that a result meaning "nothing ran" is a failure, not a success."""

    def call(message):
        result = handler(message)
        if result is not None:
            reason = _did_not_run(result)
            if reason:
                raise HandlerShapeError(reason)
        return result

    return call


def _did_not_run(result, awaited=False):
    """Why ``result`` shows the handler's body did not run, or None. Discards the unrun object.

    ``awaited``: the handler is an async def that Shoal awaited, so its body ran; what it returned
    is an awaitable it created and did not await (a missing ``await`` on its last call).
    """
    if inspect.isgenerator(result) or inspect.isasyncgen(result):
        if inspect.isgenerator(result):
            result.close()
        return ("the handler returned a generator, so its body never ran: a handler must not yield. "
                "Remove the yield (collect into a list if needed).")
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # no "coroutine was never awaited" warning on top of this error
        if awaited:
            return (f"the async handler ran, then returned an awaitable ({type(result).__name__}) that nobody "
                    "awaited: a missing await (return await ...)? Whatever that awaitable was to do did not "
                    "happen, so the entry fails; a retry runs the handler's body again.")
        return ("the handler returned an awaitable instead of running it: Shoal took it for a sync handler "
                "(a sync decorator around an async def?). Declare the handler itself with async def, or mark "
                "the wrapper with asgiref.sync.markcoroutinefunction(), so Shoal awaits it.")
    return None


# -- async handlers, on the worker's event loop ---------------------------------------------------

_close_old_connections = sync_to_async(close_old_connections, thread_sensitive=True)

# Seconds between two checks for stale database connections while async handlers run without
# failing: about one sync chunk's worth of handler time (loop.CHUNK_TARGET_SECONDS).
DB_CHECK_INTERVAL = 0.005


class _DbHygiene:
    """``close_old_connections`` for async handlers, in the thread where their ORM calls run.

    Django's async ORM runs queries in asgiref's one thread for sync code, so stale connections are
    closed there (as Django's ASGI handler does per request), never in the event loop's thread.
    Each check is a hop to that thread and back (~60 µs, one at a time): per message it would cap
    a process near 8,000 messages/s, so it runs at most every DB_CHECK_INTERVAL, and always after a
    failure (the error that broke a connection is almost always the handler's own). Like the sync
    path, which checks once per chunk of about that much handler time.
    """

    last = 0.0
    after_failure = False  # a handler failed since the last check: check before the next one

    async def check(self):
        now = time.monotonic()
        if self.after_failure or now - self.last >= DB_CHECK_INTERVAL:
            self.last = now
            self.after_failure = False
            await _close_old_connections()


_db = _DbHygiene()


async def run_chunk_async(handler, messages, guard=None, budget=None, runs=None):
    """Await the ``async def`` ``handler`` on each message in turn; return a ChunkResult.

    The guard's Redis round trips run in a thread, off the loop. Nothing is awaited between the
    last handler's return and the result: another coroutine that blocks the loop must not hold back
    the ack of this one (see eventloop._settling). With a guard the result is a FinishInThread: the
    worker's EventLoopRunner records the handled entries in the guard and settles in a thread.
    """
    await _db.check()
    return await run_chunk_async_here(handler, messages, guard, budget, runs)


async def run_chunk_async_here(handler, messages, guard=None, budget=None, runs=None):
    """``run_chunk_async`` without the stale-connection check (see run_chunk_here)."""
    if not await alone.gate.enter_async():  # not beside a suspect (alone.py); False: this is the suspect
        return await _run_chunk_async_here(handler, messages, guard, budget, runs)
    try:
        result = await _run_chunk_async_here(handler, messages, guard, budget, runs)
    except BaseException:
        alone.gate.leave(False)
        raise
    # Left once the chunk is off the running record: in the thread that finishes it, if one does.
    return alone.left_after(result, alone.gate.leave, runs is not None)


async def _run_chunk_async_here(handler, messages, guard, budget, runs):
    chunk = Chunk(messages, guard, budget)
    try:
        runnable = chunk.runnable()
        if guard is not None and runnable:
            runnable = await asyncio.to_thread(chunk.admit, runnable)
        if runs is not None:  # after the guard's admission, as run_chunk_here
            try:
                await runs.started_async(chunk.messages, alone=alone.holding())
            except RunsNotRecorded:
                chunk.abandon()
                raise
            chunk.started = time.perf_counter()
        left = []
        for index, message in enumerate(runnable):
            if chunk.out_of_time(index):
                left = runnable[index:]
                break
            try:
                result = await handler(message)
            except BaseException as exc:  # see the module docstring
                task = asyncio.current_task()
                if isinstance(exc, asyncio.CancelledError) and task.cancelling():
                    if cancelled_by_shutdown(task):
                        raise  # the worker's shutdown cancels the chunk: its entries stay pending
                    while task.uncancel():  # consumed here: the chunk's next awaits must not be cancelled
                        pass
                    detail = f": {exc}" if str(exc) else ""
                    exc = HandlerCancelledError(
                        "the handler's task was cancelled, not by Shoal (asyncio.current_task().cancel() in the "
                        f"handler, or a library cancelling the task it runs in){detail}").with_traceback(exc.__traceback__)
                chunk.failed(message, exc)
            else:
                reason = None if result is None else _did_not_run(result, awaited=True)
                if reason:
                    chunk.failed(message, HandlerShapeError(reason))
                else:
                    chunk.ran(message)
    except asyncio.CancelledError:
        chunk.abandon()
        raise
    if chunk.errored:
        _db.after_failure = True  # the error that broke a connection is almost always the handler's own
    if guard is not None or (runs is not None and runs.writes_at_end(chunk.result)):
        # A thread of the loop's pool does not see the task's context: whether this is a suspect's run is asked here.
        return FinishInThread(functools.partial(_end_guard_and_close, chunk, left, runs, alone.suspect_run()))
    return _finished(chunk.close(left), runs, chunk.messages)


def _end_guard_and_close(chunk, left, runs=None, suspect=False):
    chunk.end_guard()
    return _finished(chunk.close(left), runs, chunk.messages, suspect)
