"""Time limits (docs/tasks.md, "Time limits"): an attempt running past its ``timeout`` ends with TaskTimeout.

Python cannot stop a thread, so a sync task past its limit is ended from outside it. One watchdog
thread per process (started by the first attempt that has a limit) does what the attempt's own end
would have done: ``Attempt.failed(TaskTimeout)`` writes the result (FAILED, or READY with the retry
published as a deferred message, as the task's retry rules say), and the entry is settled here, since
the thread that holds it may never return: acked when the task is retried, dead-lettered when it is
FAILED (``deadletters.move``, atomic and exactly once). Then the watchdog asks for the process to be
replaced (shoal_common.replacement): a supervised worker exits with EXIT_REPLACED and its supervisor
starts a fresh one at once; a ``runconsumer`` without a supervisor execs itself anew. That is what
stops the task, and the worker's capacity comes back whole. The process's other in-flight tasks stop
with it and are delivered again, as at-least-once allows: the worker marks its liveness deadline lapsed
before it goes, so they are taken over at once rather than after PENDING_TIMEOUT_MS.

A late finish never overwrites the end written here: the attempt's thread and the watchdog settle who
ends the attempt under one lock (``Watch.finish``, ``Watch.expire``); a thread that loses writes
nothing and returns once the watchdog has settled its entry. Where the process cannot be replaced
(``runconsumer`` called in-process, e.g. by ``call_command``), the thread runs on and its capacity
comes back only when the task returns; the log says so.

Async tasks need none of this: ``asyncio.timeout`` cancels them on the worker's event loop.
"""
import heapq
import itertools
import logging
import threading
import time

from shoal_common import replacement
from streams_app.deadletters import store as deadletters
from streams_app.exceptions import RejectMessage
from streams_app.tasks.exceptions import TaskTimeout

logger = logging.getLogger("streams_app.tasks")


def timeout_error(attempt, seconds):
    return TaskTimeout(f"task {attempt.data['task']} (result {attempt.data['id']}) ran past its timeout of "
                       f"{seconds:g} s")


class Watch:
    """One attempt's limit: who ends the attempt, its own thread (``finish``) or the watchdog (``expire``)."""

    __slots__ = ("attempt", "seconds", "deadline", "state", "settled", "lock", "watchdog")

    def __init__(self, attempt, seconds, watchdog):
        self.watchdog = watchdog
        self.attempt = attempt
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.state = "running"
        self.settled = threading.Event()
        self.lock = threading.Lock()

    def finish(self):
        """The task returned or raised: True when its thread ends the attempt as ever; False when the
        watchdog ended it first (the thread then writes nothing: it waits until the entry is settled)."""
        with self.lock:
            if self.state == "running":
                self.state = "finished"
                self.watchdog.finished(self)
            if self.state == "finished":  # also a second call (a success whose value then fails to encode)
                return True
        self.settled.wait()
        return False

    def expire(self):
        with self.lock:
            if self.state != "running":
                return False
            self.state = "expired"
            return True


class Watchdog:
    """The process's watchdog thread: a heap of watches by deadline."""

    def __init__(self):
        self.heap = []
        self.order = itertools.count()  # ties on the deadline never compare two Watches
        self.condition = threading.Condition()
        self.thread = None
        self.stale = 0  # about how many watches in the heap are finished (exact after a rebuild)

    def watch(self, attempt, seconds):
        watch = Watch(attempt, seconds, self)
        with self.condition:
            heapq.heappush(self.heap, (watch.deadline, next(self.order), watch))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="shoal-task-timeouts", daemon=True)
                self.thread.start()
            self.condition.notify()
        return watch

    def finished(self, watch):
        """``watch``'s task returned in time. A finished watch leaves the heap lazily, at its deadline, but
        its attempt (the message, the arguments) is let go at once, and once finished watches are most of
        the heap it is rebuilt without them: at a thousand quick tasks a second under a one-hour limit, the
        heap would otherwise hold 3.6 million of them."""
        watch.attempt = None
        with self.condition:
            self.stale += 1
            if len(self.heap) > 1024 and self.stale > 3 * len(self.heap) // 4:
                self.heap = [item for item in self.heap if item[2].state == "running"]
                heapq.heapify(self.heap)
                self.stale = 0

    def _run(self):
        while True:
            with self.condition:
                while not self.heap or self.heap[0][0] > time.monotonic():
                    # At most an hour at a time: Condition.wait refuses more than threading.TIMEOUT_MAX (a
                    # timeout of 1e10 s would kill this thread, and with it every time limit of the process).
                    self.condition.wait(None if not self.heap else min(3600.0, self.heap[0][0] - time.monotonic()))
                _, _, watch = heapq.heappop(self.heap)
                if watch.state == "finished":
                    self.stale = max(0, self.stale - 1)
            if watch.expire():
                try:
                    end(watch)
                except Exception:  # noqa: BLE001 -- the watchdog must outlive one Redis error
                    logger.exception("Could not end task %s (result %s) past its timeout",
                                     watch.attempt.data["task"], watch.attempt.data["id"])
                finally:
                    watch.settled.set()
                if replacement.request(f"task {watch.attempt.data['task']} (result {watch.attempt.data['id']}) "
                                       f"ran past its timeout of {watch.seconds:g} s"):
                    return  # this process is being replaced: nothing more to watch
                logger.warning("Task %s (result %s) ran past its timeout; this process cannot be replaced (not "
                               "started by runconsumer), so its thread runs on until the task returns",
                               watch.attempt.data["task"], watch.attempt.data["id"])


def end(watch):
    """The attempt's end, as its thread would have written it, and its entry settled."""
    attempt = watch.attempt
    exc = timeout_error(attempt, watch.seconds)
    outcome = attempt.failed(exc)
    message = attempt.message
    if outcome is None:  # retried as a deferred message: this entry is done
        attempt.conn.xack(message.stream, message.group, message.id)
    elif isinstance(outcome, RejectMessage):
        deadletters.move(attempt.conn, message.stream, message.group, [(message.id, str(outcome), "")])
    # else the consumer's own retry of the entry (an idempotency guard, or the retry could not be
    # published): it stays pending, and the process's replacement takes it over.
    logger.error("Task %s (result %s) ran past its timeout of %g s: %s", attempt.data["task"], attempt.data["id"],
                 watch.seconds, "retried" if outcome is None else "FAILED" if isinstance(outcome, RejectMessage)
                 else "its entry is delivered again")


_watchdog = Watchdog()


def ended_elsewhere(watch):
    """Whether the watchdog ended the attempt of ``watch`` (None: no limit) before its task returned."""
    return watch is not None and not watch.finish()


def watch(attempt, seconds):
    """Start watching ``attempt`` (its task about to run) for ``seconds``; the caller calls ``finish()``
    on the returned Watch when the task returns or raises."""
    return _watchdog.watch(attempt, seconds)
