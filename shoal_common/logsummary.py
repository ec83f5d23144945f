"""Repeated log lines, bounded: the first few of a kind per interval, then one summary line.

A failing handler would otherwise log a line per failed delivery (14k lines for 3,000 messages
failing five times each). The detail of every failure is kept where it belongs, in the dead letter;
the log keeps the first occurrences and how many more there were.
"""
import threading
import time


class RepeatSummary:
    def __init__(self, logger, *, first=5, interval=60.0, clock=time.monotonic):
        self.logger = logger
        self.first = first
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._windows = {}  # key -> [window start, lines logged, lines held back, what to call them]

    def log(self, level, key, what, msg, *args, **kwargs):
        """Log ``msg`` unless ``first`` lines of ``key`` were logged this interval; count it then."""
        now = self.clock()
        with self._lock:
            self._close_windows(now)
            window = self._windows.setdefault(key, [now, 0, 0, what])
            if window[1] >= self.first:
                window[2] += 1
                return
            window[1] += 1
        self.logger.log(level, msg, *args, **kwargs)

    def flush(self):
        """Summarise every open window now (at shutdown)."""
        with self._lock:
            self._close_windows(None)

    def _close_windows(self, now):
        for key, (started, _, held, what) in list(self._windows.items()):
            if now is not None and now - started < self.interval:
                continue
            del self._windows[key]
            if held:
                seconds = (now if now is not None else self.clock()) - started
                self.logger.warning("... and %d more %s in %.0fs, not logged one by one (each is in its dead "
                                    "letter once it gets there)", held, what, seconds)
