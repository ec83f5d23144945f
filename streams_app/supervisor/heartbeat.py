"""Worker -> master heartbeats through the mtime of an unlinked temp file (gunicorn's WorkerTmp idea).

The master creates the file and hands its descriptor to the worker; the worker sets the mtime, the
master reads it with fstat. No Redis, no pipe to drain, and a master that is busy or restarting
loses nothing. The mtime is 0 until the worker has booted: the first beat says "consuming".

Beats are readings of ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for every process of the host),
never of the wall clock: an NTP step or a VM resume must not make a healthy worker look stuck, nor hide
a stuck one for as long as the clock went back.

A worker beats "now" while its handlers make progress (or it has nothing to do). When every
running handler has been stuck since time T, it keeps beating T, so the master sees the beat age
grow and replaces the worker after the heartbeat timeout.
"""
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor


class HeartbeatFile:
    """Master side: one per worker process."""

    def __init__(self, directory=None):
        fd, path = tempfile.mkstemp(prefix="shoal-heartbeat-", dir=directory)
        os.unlink(path)  # nothing to clean up, whatever happens to either process
        os.utime(fd, (0, 0))
        self.fd = fd

    def last_beat(self):
        """``time.monotonic()`` of the last beat; 0 before the first."""
        return os.fstat(self.fd).st_mtime

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class ProgressExecutor(ThreadPoolExecutor):
    """A handler pool that remembers when a handler last started or finished (monotonic clock)."""

    def __init__(self, *args, clock=time.monotonic, **kwargs):
        super().__init__(*args, **kwargs)
        self._clock = clock
        self._lock = threading.Lock()
        self.running = 0
        self.last_activity = clock()

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(self._tracked, fn, *args, **kwargs)

    def _tracked(self, fn, *args, **kwargs):
        self._mark(1)
        try:
            return fn(*args, **kwargs)
        finally:
            self._mark(-1)

    def _mark(self, delta):
        with self._lock:
            self.running += delta
            self.last_activity = self._clock()

    def progress_stamp(self, now):
        """``now`` while idle; else when a handler last started or finished."""
        with self._lock:
            return now if self.running == 0 else self.last_activity


class Beater:
    """Worker side: ``Worker(heartbeat=Beater(...))`` calls it on every pass of its main loop."""

    def __init__(self, fd, interval, *, master_pid=None, clock=time.monotonic, on_orphaned=None):
        self.fd = fd
        self.interval = interval
        self.master_pid = master_pid
        self.clock = clock
        self.on_orphaned = on_orphaned
        self.last = None

    def __call__(self, worker):
        now = self.clock()
        if self.master_pid is not None and os.getppid() != self.master_pid and self.on_orphaned:
            self.on_orphaned(worker)
        if self.last is not None and now - self.last < self.interval:
            return
        self.last = now
        # The Worker combines its thread pool's and event loop's progress; else the pool's own.
        progress = getattr(worker, "progress_stamp", None) or getattr(worker.executor, "progress_stamp", None)
        stamp = progress(now) if progress is not None else now
        os.utime(self.fd, (stamp, stamp))
