"""The event loop of a worker process that has ``async def`` handlers, in a thread of its own.

It looks like the handler thread pool to the read loops: ``submit(coroutine_function, *args)``
returns a ``concurrent.futures.Future``, so a GroupLoop collects, acks and retries async chunks with
the very code it uses for threads. At most ``concurrency`` chunks run at once in the whole process
(one semaphore for all groups); the others wait for a slot, their entries pending like those queued
for a busy thread pool.

Stopping: the read loops first await in-flight chunks until the shutdown deadline, then
``shutdown()`` cancels what still runs. A cancelled chunk acks nothing: its entries stay pending for
takeover, exactly like those of a handler thread that outlived the timeout.
"""
import asyncio
import concurrent.futures
import functools
import logging
import threading
import time

logger = logging.getLogger("streams_app.consumer")

# Seconds cancelled coroutines get to unwind (their finally blocks) before the worker exits.
CANCEL_GRACE = 2.0


class EventLoopRunner:
    def __init__(self, concurrency, *, clock=time.monotonic):
        self.concurrency = concurrency
        self.loop = asyncio.new_event_loop()
        self.limit = asyncio.Semaphore(concurrency)
        self._clock = clock  # the heartbeat's clock (supervisor.heartbeat): monotonic, never the wall
        self._stopping = False
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
        return asyncio.run_coroutine_threadsafe(self._bounded(fn, args), self.loop)

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
            task = self.loop.create_task(self._bounded(fn, args))
            task.add_done_callback(functools.partial(_settle, future))

    async def _bounded(self, fn, args):
        async with self.limit:
            self._mark(1)
            try:
                return await fn(*args)
            finally:
                self._mark(-1)

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
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not stuck:
            self.thread.join(timeout=grace)
        return stuck

    async def _cancel_all(self, grace):
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if not tasks:
            return 0
        logger.warning("Consumer: cancelling %d async handler tasks still running after the shutdown timeout", len(tasks))
        for task in tasks:
            task.cancel()
        _, pending = await asyncio.wait(tasks, timeout=grace)
        return len(pending)


def _settle(future, task):
    """Copy a finished task's outcome to the concurrent Future the read loop waits on."""
    if task.cancelled():
        future.cancel()
        future.set_running_or_notify_cancel()
        return
    if not future.set_running_or_notify_cancel():
        return
    exc = task.exception()
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(task.result())
