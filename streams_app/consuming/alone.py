"""Suspects run alone in their process (the run ledger, runs.py; issue 32).

A suspect is an entry taken over from a consumer that was running it when it died. If it is what
kills workers, its next death must be charged to it and to nothing else: so it starts only once no
other chunk of the process (any group, thread or coroutine) runs, and once what those chunks
acked has been sent (the read loops' XACK), else entries that succeeded beside it would run again
after its death; and no other chunk starts until it ends. Suspects take turns.

Every chunk passes the gate (``enter``/``leave``, a lock round per chunk); a suspect waits
``ALONE_WAIT_SECONDS`` at most for the others (a hung handler must not stop the process for good),
then runs all the same.
"""
import asyncio
import contextvars
import logging
import threading
import time

from streams_app.consuming.eventloop import FinishInThread

logger = logging.getLogger("streams_app.consumer")

# Longest a suspect waits for the other chunks to end and their acks to be sent.
ALONE_WAIT_SECONDS = 10.0
# How often a coroutine waiting at the gate looks again: waiting in a thread would hold one of the
# threads the running chunks' own blocking steps need (asyncio.to_thread).
POLL_SECONDS = 0.005

# This thread or task runs a suspect: "alone" (nothing else of the process ran as it started, nor
# can start: a death now is its own), or "late" (it waited ALONE_WAIT_SECONDS and runs beside others).
_holding = contextvars.ContextVar("shoal_alone", default="")


def holding():
    """True in the thread or task that runs a suspect alone (``run_alone``), with nothing else of the
    process running: a death now is its own (not after a late start beside others)."""
    return _holding.get() == "alone"


def suspect_run():
    """True in the thread or task that runs a suspect (alone, or late beside others)."""
    return bool(_holding.get())


class Gate:
    def __init__(self):
        self._cond = threading.Condition()
        self._running = 0  # chunks running, suspects aside
        self._wanted = 0  # suspects waiting for their turn (no new chunk starts meanwhile)
        self._alone = False
        self._unacked = 0  # chunks that returned acks the read loops have not sent yet

    def enter(self):
        """A chunk starts (waits while a suspect runs or waits). False inside a suspect's own run, which
        passed already: then no ``leave``."""
        if _holding.get():
            return False
        with self._cond:
            while self._alone or self._wanted:
                self._cond.wait()
            self._running += 1
        return True

    def try_enter(self):
        """``enter`` without waiting (the event loop must not block): None when it would wait."""
        if _holding.get():
            return False
        with self._cond:
            if self._alone or self._wanted:
                return None
            self._running += 1
            return True

    def leave(self, acked):
        """A chunk that ``enter`` counted ended; ``acked``: it returned acks that a read loop sends later (``sent``)."""
        with self._cond:
            self._running -= 1
            self._unacked += bool(acked)
            self._cond.notify_all()

    def sent(self, chunks):
        """A read loop sent the acks of ``chunks`` chunks."""
        if not chunks:
            return
        with self._cond:
            self._unacked = max(0, self._unacked - chunks)
            self._cond.notify_all()

    def _take(self, late):
        """Under the lock: the waiting suspect's turn starts, if no other suspect runs and (unless
        ``late``: it waited ALONE_WAIT_SECONDS) no other chunk runs and no ack of one waits. Returns
        "alone" (no other chunk runs) or "late" (others still run beside it), else "" (not yet)."""
        if self._alone or ((self._running or self._unacked) and not late):
            return ""
        self._alone = True
        self._wanted -= 1
        if self._running:
            logger.warning("A suspect (an entry that was running when a worker died) waited %g s for %d other "
                           "chunks to end and runs beside them: a death now is charged to nobody",
                           ALONE_WAIT_SECONDS, self._running)
            return "late"
        return "alone"

    def wait_alone(self):
        """Blocks until this suspect runs alone; pair with ``release``."""
        deadline = time.monotonic() + ALONE_WAIT_SECONDS
        with self._cond:
            self._wanted += 1
            while not (how := self._take(time.monotonic() >= deadline)):
                self._cond.wait(timeout=max(0.001, min(0.1, deadline - time.monotonic())))
        return how

    async def wait_alone_async(self):
        """``wait_alone`` on the event loop: polls, so no thread waits (the loop's threads run the others)."""
        deadline = time.monotonic() + ALONE_WAIT_SECONDS
        with self._cond:
            self._wanted += 1
        try:
            while True:
                with self._cond:
                    if how := self._take(time.monotonic() >= deadline):
                        return how
                await asyncio.sleep(POLL_SECONDS)
        except BaseException:
            with self._cond:
                self._wanted -= 1
                self._cond.notify_all()
            raise

    async def enter_async(self):
        """``enter`` on the event loop (polls, as ``wait_alone_async``)."""
        while (entered := self.try_enter()) is None:
            await asyncio.sleep(POLL_SECONDS)
        return entered

    def release(self, acked):
        with self._cond:
            self._alone = False
            self._unacked += bool(acked)
            self._cond.notify_all()

    def run_alone(self, run, *args):
        """``run(*args)`` (a chunk of one suspect) alone; returns its ChunkResult."""
        token = _holding.set(self.wait_alone())
        result = None
        try:
            result = run(*args)
            return result
        finally:
            _holding.reset(token)
            self.release(result is not None and bool(result.acked))

    async def run_alone_async(self, run, *args):
        token = _holding.set(await self.wait_alone_async())
        try:
            result = await run(*args)
        except BaseException:
            self.release(False)
            raise
        finally:
            _holding.reset(token)
        return left_after(result, self.release, True)


def left_after(result, leave, counted):
    """``result`` of an async chunk; ``leave(acked)`` is called once it is final: now, or after the
    FinishInThread step that takes it off the running record (eventloop.FinishInThread)."""
    if not isinstance(result, FinishInThread):
        leave(counted and bool(result.acked))
        return result
    fn = result.fn

    def finish():
        final = None
        try:
            final = fn()
            return final
        finally:
            leave(counted and final is not None and bool(final.acked))

    return FinishInThread(finish)


gate = Gate()
