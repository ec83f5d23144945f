"""The Prometheus multiprocess directory: scrapes under a lock, and dead processes' files compacted.

prometheus_client keeps one mmap file per process and metric type in ``PROMETHEUS_MULTIPROC_DIR`` and
never removes a dead process's counters (client_python issues 275 and 568). With workers recycled by
``max_requests`` the directory, and the time every scrape takes, would grow without bound. So when a
process dies its supervisor (gunicorn's master in ``child_exit``; runconsumer's master likewise) calls
``process_dead(pid)``: the dead process's counter, histogram and summary values are added into one
``<type>_archive.db`` per type and its files are deleted. Sums are unchanged, so no counter goes
backwards. Gauges describe a live process, so a dead one's gauge files are simply removed.

Compaction and collection exclude each other with ``flock`` on ``.lock`` in the directory: otherwise a
scrape could read both the dead file and the archive that already holds its values (a counter jumping
up, then back down), or find a file gone between its glob and its read (an error).

This module imports neither Django nor the project: gunicorn's master imports it, and whatever the
master imports is inherited, unreloaded, by the workers it forks after a HUP.
"""
import contextlib
import fcntl
import glob
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

ENV = "PROMETHEUS_MULTIPROC_DIR"
LOCK_FILE = ".lock"
ARCHIVE = "archive"
# Types whose values from several processes are simply added up (histogram buckets are stored
# per bucket, not cumulatively, so they add up too).
SUMMED_TYPES = ("counter", "histogram", "summary")


def directory():
    """The multiprocess directory of this process, or None in single-process mode."""
    return os.environ.get(ENV) or None


@contextlib.contextmanager
def locked(path, *, exclusive):
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


class LockedMultiProcessCollector(MultiProcessCollector):
    """``MultiProcessCollector`` that never reads the directory while it is being compacted."""

    def collect(self):
        with locked(self._path, exclusive=False):
            # A process that is just starting creates its file empty and sizes it a moment later;
            # prometheus_client would fail the whole scrape on it (struct.error). It holds no value yet.
            files = [f for f in glob.glob(os.path.join(self._path, "*.db")) if _size(f) >= 8]
            return list(self.merge(files, accumulate=True))


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:  # compacted away between glob and stat
        return 0


def multiprocess_registry(path=None):
    """A registry that reports every process writing to ``path`` (default: this process's directory)."""
    registry = CollectorRegistry()
    LockedMultiProcessCollector(registry, path or directory())
    return registry


def reset(path):
    """Create ``path`` if needed and delete every metric file in it: files there are from a previous run.

    Only for a supervisor at start-up, before any of its processes write there.
    """
    os.makedirs(path, exist_ok=True)
    with locked(path, exclusive=True):
        for name in glob.glob(os.path.join(path, "*.db")) + glob.glob(os.path.join(path, "*.db.tmp")):
            os.remove(name)


def process_dead(pid, path=None):
    """Fold the dead process ``pid``'s values into the archives and remove its files."""
    path = path or directory()
    if not path or not os.path.isdir(path):
        return
    with locked(path, exclusive=True):
        mark_process_dead(pid, path)
        for typ in SUMMED_TYPES:
            dead = os.path.join(path, f"{typ}_{pid}.db")
            if os.path.exists(dead):
                _fold_into_archive(path, typ, dead)
        for name in glob.glob(os.path.join(path, f"gauge_*_{pid}.db")):
            os.remove(name)


def _fold_into_archive(path, typ, dead):
    archive = os.path.join(path, f"{typ}_{ARCHIVE}.db")
    totals = defaultdict(float)
    for source in (archive, dead):
        if os.path.exists(source):
            for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(source):
                totals[key] += value
    # Written beside the archive and renamed over it: a crash mid-write leaves the old archive
    # and the dead file, so nothing is counted twice or lost. The name does not end in .db,
    # so collectors never read a half-written file.
    tmp = archive + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    out = MmapedDict(tmp)
    try:
        for key, value in totals.items():
            out.write_value(key, value, 0.0)
    finally:
        out.close()
    os.replace(tmp, archive)
    os.remove(dead)


# -- the supervisor's own directories ----------------------------------------------------------

SUPERVISOR_PARENT = "shoal-consumer-metrics"
OWNER_FILE = ".owner"
_owned = []  # open, locked owner files: the lock lasts as long as this process


def supervisor_directory(parent=None):
    """A fresh directory for a runconsumer master's worker metrics, under one known parent.

    The master holds a lock on a file inside it for its whole life. A master killed with SIGKILL
    cannot remove its directory, so each new one first removes the directories whose lock nobody
    holds any more (younger ones are spared: their master may not have locked them yet).
    """
    parent = Path(parent or tempfile.gettempdir()) / SUPERVISOR_PARENT
    parent.mkdir(mode=0o700, exist_ok=True)
    for old in parent.iterdir():
        try:
            if not old.is_dir() or time.time() - old.stat().st_mtime < 5:
                continue
            with open(old / OWNER_FILE, "a") as owner:
                fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while its master lives
            shutil.rmtree(old, ignore_errors=True)
        except OSError:
            continue
    path = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=parent))
    owner = open(path / OWNER_FILE, "a")
    fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _owned.append(owner)
    return str(path)
