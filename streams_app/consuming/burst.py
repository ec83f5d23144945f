"""runconsumer --burst across the read loops of one process: when the burst is over.

One loop's "my last read found nothing and nothing of mine runs" is not enough: a handler of another
group may publish to this loop's stream after that read (a chained flow: billing publishes invoices,
which shipping reads). The burst ends when every loop is idle at once and each one's last empty read
started after the last handler of the process finished (``epoch`` counts finished handler chunks), so
whatever a handler published was there for some read to find. Once decided, it stays decided for all.
"""
import threading


class BurstGaveUp(Exception):
    """A burst ended with work left (runconsumer exits EXIT_BURST_UNFINISHED); the message says why."""


class BurstGate:
    def __init__(self, loops):
        self._lock = threading.Lock()
        self._loops = loops  # how many read loops take part
        self._idle = {}  # id(loop) -> the epoch its last empty read started at
        self.epoch = 0
        self.over = False

    def progressed(self):
        """A handler chunk finished (its publishes are in Redis): every loop must read again."""
        with self._lock:
            self.epoch += 1

    def busy(self, loop):
        with self._lock:
            self._idle.pop(id(loop), None)

    def idle(self, loop, read_at):
        """``loop`` is idle since an empty read that started at epoch ``read_at``; True once the burst is over."""
        with self._lock:
            self._idle[id(loop)] = read_at
            if not self.over and len(self._idle) == self._loops and all(e == self.epoch for e in self._idle.values()):
                self.over = True
            return self.over
