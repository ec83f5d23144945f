"""One relay at a time where the database cannot share the work out (SQLite).

PostgreSQL lets several relays claim disjoint rows (``SELECT ... FOR UPDATE SKIP LOCKED``). SQLite
has no row locks: two relays would read the same rows and send each twice (the consumers' guard
would drop the copies, but the work and the order would suffer). So on SQLite a relay holds an
exclusive ``flock`` on a file next to the database; the kernel releases it when the process dies,
SIGKILL included, so a standby relay takes over without anyone cleaning up.
"""
import fcntl
import os
import threading

from django.db import connections

_memory_lock = threading.Lock()  # an in-memory SQLite database lives in one process: a thread lock is enough


class NoGuard:
    """PostgreSQL (and any database with SKIP LOCKED): every relay may work at once."""

    description = None

    def acquire(self):
        return True

    def release(self):
        pass


class FileGuard:
    def __init__(self, path):
        self.path = path
        self.description = f"the SQLite relay lock {path}"
        self._fd = None

    def acquire(self):
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # for people: which process relays
        self._fd = fd
        return True

    def release(self):
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


class ThreadGuard:
    description = "the in-process relay lock (in-memory SQLite database)"

    def __init__(self):
        self._held = False

    def acquire(self):
        if not self._held:
            self._held = _memory_lock.acquire(blocking=False)
        return self._held

    def release(self):
        if self._held:
            _memory_lock.release()
            self._held = False


def guard_for(using):
    connection = connections[using]
    if connection.features.has_select_for_update_skip_locked:
        return NoGuard()
    name = str(connection.settings_dict["NAME"])
    if connection.vendor != "sqlite" or name == ":memory:" or "mode=memory" in name:
        return ThreadGuard()
    return FileGuard(f"{name}.outbox-relay.lock")
