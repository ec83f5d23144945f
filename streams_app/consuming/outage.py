"""One process's word on a Redis outage: each of its read loops meets it, the log says it once.

Every read loop of a consumer process (one per group) backs off on its own, since each has its own
reads to retry; the log is the process's. "Redis unreachable" is logged by the first loop that
meets the outage, "reachable again" by the last of those loops to get through.
"""
import threading
import time


class OutageLog:
    def __init__(self):
        self._lock = threading.Lock()
        self._down = set()
        self.since = None  # time.monotonic() when the process met the outage; None while Redis answers

    def went_down(self, loop):
        """True for the first loop of the process to meet the outage: that one logs it."""
        with self._lock:
            first = not self._down
            self._down.add(id(loop))
            if first:
                self.since = time.monotonic()
        return first

    def came_back(self, loop):
        """True for the last loop that met the outage to get through: that one logs the recovery."""
        with self._lock:
            if id(loop) not in self._down:
                return False
            self._down.discard(id(loop))
            if not self._down:
                self.since = None
            return not self._down
