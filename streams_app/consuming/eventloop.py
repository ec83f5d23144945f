"""The event loop of a worker process that has ``async def`` handlers, in a thread of its own.

It looks like the handler thread pool to the read loops: ``submit(coroutine_function, *args)``
returns a ``concurrent.futures.Future``, so a GroupLoop collects, acks and retries async chunks with
the very code it uses for threads. At most ``concurrency`` chunks run at once in the whole process
(one semaphore for all groups); the others wait for a slot, their entries pending like those queued
for a busy thread pool.

Results leave the loop the moment a chunk returns: the coroutine itself settles the read loop's
Future, with no further trip through the event loop. A handler that blocks the loop (a
``time.sleep`` or a sync client in an ``async def``) must not hold back the acks of handlers that
already returned: they would be delivered again, and dead-lettered if that repeats.

Stopping: the read loops first await in-flight chunks until the shutdown deadline, then
``shutdown()`` cancels what still runs. A cancelled chunk acks nothing: its entries stay pending for
takeover, exactly like those of a handler thread that outlived the timeout. Tasks a handler spawned
and did not await (``asyncio.create_task``) are cancelled at the same time.
"""
import asyncio
import concurrent.futures
import functools
import logging
import threading
import time
import weakref

logger = logging.getLogger("streams_app.consumer")

# Seconds cancelled coroutines get to unwind (their finally blocks) before the worker exits.
CANCEL_GRACE = 2.0

# Tasks that EventLoopRunner.shutdown() cancelled. Any other cancel of a chunk's task came from the
# handler itself (asyncio.current_task().cancel(), a library cancelling the wrong task): a failure
# of its message, not a shutdown.
_shutdown_cancelled = weakref.WeakSet()


class FinishInThread:
    """What a chunk returns when its last step is a blocking call (the idempotency guard's Redis
    round trip): ``fn()`` runs in a thread and its return settles the read loop's Future there,
    without coming back to the event loop, which another handler may be blocking."""

    def __init__(self, fn):
        self.fn = fn


def cancel_for_shutdown(task):
    """Cancel ``task`` as the worker stopping does: its chunk acks nothing and re-raises."""
    _shutdown_cancelled.add(task)
    task.cancel()


def cancelled_by_shutdown(task):
    """Whether ``task``'s cancel came from the worker stopping (its entries then stay pending)."""
    return task in _shutdown_cancelled


class EventLoopRunner:
    def __init__(self, concurrency, *, clock=time.monotonic):
        self.concurrency = concurrency
        self.loop = asyncio.new_event_loop()
        self.limit = asyncio.Semaphore(concurrency)
        self._clock = clock  # the heartbeat's clock (supervisor.heartbeat): monotonic, never the wall
        self._stopping = False
        # Threads for the chunks' last blocking step (FinishInThread): like asyncio.to_thread, but
        # their results reach the read loop without the event loop.
        self._finishing = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="shoal-finish")
        self._chunks = set()  # the tasks running chunks (not those a handler spawned itself)
        # Progress, for the supervisor's heartbeat (as ProgressExecutor for threads). Written only
        # in the loop's thread; the heartbeat reads two ints, which needs no lock.
        self.running = 0
        self.last_activity = clock()
        self.thread = threading.Thread(target=self._run, name="shoal-asyncio", daemon=True)
        self.thread.start()

    def _run(self):
        asyncio.set_event_loop(self.loop)
        while not self._stopping:
            try:
                self.loop.run_forever()
            except BaseException:
                # A task the handler created itself (not awaited by Shoal's chunk) raised
                # SystemExit/KeyboardInterrupt, which asyncio re-raises out of the loop. The chunk
                # that awaits the handler caught its own; keep the loop serving the others.
                logger.exception("Consumer: an exception escaped a task of an async handler; the event loop goes on")
        self.loop.close()

    def submit(self, fn, /, *args):
        """Run ``await fn(*args)`` on the loop, within the concurrency bound; a concurrent Future."""
        return self.submit_many(fn, [args])[0]

    def submit_many(self, fn, argsets):
        """``submit(fn, *args)`` for each of ``argsets`` with one wake-up of the loop; a Future each.

        A read hands the loop hundreds of messages at once: one ``call_soon_threadsafe`` (a write
        to the loop's self-pipe) per message was a large part of the per-message cost.
        """
        futures = [concurrent.futures.Future() for _ in argsets]
        self.loop.call_soon_threadsafe(self._start_many, fn, argsets, futures)
        return futures

    def _start_many(self, fn, argsets, futures):
        for args, future in zip(argsets, futures):
            task = self.loop.create_task(self._settling(future, fn, args))
            self._chunks.add(task)
            task.add_done_callback(self._chunks.discard)

    async def _settling(self, future, fn, args):
        """``await fn(*args)`` and settle ``future`` right away, not in a done callback.

        A done callback runs on a later turn of the loop, after whatever coroutine is ready next:
        if that one blocks the loop, the result (and its ack) would wait for it.
        """
        try:
            async with self.limit:
                self._mark(1)
                try:
                    result = await fn(*args)
                finally:
                    self._mark(-1)
        except asyncio.CancelledError:
            _settle(future, cancelled=True)
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the read loop, which counts a failed delivery
            _settle(future, exc=exc)
        else:
            if isinstance(result, FinishInThread):
                try:
                    finishing = self._finishing.submit(result.fn)
                except RuntimeError as exc:  # shut down meanwhile: the entries stay pending for takeover
                    _settle(future, exc=exc)
                else:
                    finishing.add_done_callback(functools.partial(_settle_from, future))
                return
            _settle(future, result=result)

    def _mark(self, delta):
        self.running += delta
        self.last_activity = self._clock()

    def progress_stamp(self, now):
        """``now`` while idle; else when a chunk last started or finished (see supervisor.heartbeat)."""
        return now if self.running == 0 else self.last_activity

    def shutdown(self, grace=CANCEL_GRACE):
        """Cancel every coroutine still running, wait ``grace`` s for them to unwind, stop the loop.

        Returns how many did not finish (ignored the cancel, or the loop itself is blocked by a
        handler making a blocking call): the caller then exits without waiting for them.
        """
        future = asyncio.run_coroutine_threadsafe(self._cancel_all(grace), self.loop)
        try:
            stuck = future.result(timeout=grace + 1)
        except TimeoutError:
            stuck = max(1, self.running)  # the loop does not answer: blocked inside a handler
        self._stopping = True
        self._finishing.shutdown(wait=False)
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not stuck:
            self.thread.join(timeout=grace)
        return stuck

    async def _cancel_all(self, grace):
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if not tasks:
            return 0
        chunks = sum(task in self._chunks for task in tasks)
        if chunks:
            logger.warning("Consumer: cancelling %d async handlers still running after the shutdown timeout", chunks)
        if len(tasks) > chunks:
            # Not handlers: tasks a handler started (asyncio.create_task) and did not await. Their
            # handlers returned and were acked; what these tasks had left to do is lost.
            logger.warning("Consumer: cancelling %d tasks that async handlers started without awaiting them "
                           "(their messages were acked when the handlers returned)", len(tasks) - chunks)
        for task in tasks:
            cancel_for_shutdown(task)
        _, pending = await asyncio.wait(tasks, timeout=grace)
        return len(pending)


def _settle_from(future, done):
    """Settle ``future`` with the outcome of the finished concurrent Future ``done``."""
    exc = done.exception()
    if exc is not None:
        _settle(future, exc=exc)
    else:
        _settle(future, result=done.result())


def _settle(future, result=None, exc=None, cancelled=False):
    """Hand a chunk's outcome to the concurrent Future the read loop waits on."""
    if cancelled:
        future.cancel()
        future.set_running_or_notify_cancel()
        return
    if not future.set_running_or_notify_cancel():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
