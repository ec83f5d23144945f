"""Finding the processes a test started, and only those.

Other checkouts run their own consumers, gunicorns and registration processes on this host, so a test
never scans all of /proc or signals by name: it starts from a pid it owns (a ``Popen``) and walks down
to that process's children through ``/proc/<pid>/task/*/children``.
"""
from pathlib import Path


def children(pid):
    """Pids of the direct children of ``pid`` (empty once it is gone)."""
    found = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(p) for p in path.read_text().split()]
        except OSError:  # the thread or the process ended while we read
            pass
    return sorted(set(found))


def cmdline(pid):
    """The command line of ``pid`` as one string ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def children_running(pid, text):
    """Children of ``pid`` whose command line contains ``text``."""
    return [child for child in children(pid) if text in cmdline(child)]


def descendants(pid):
    """Every process below ``pid`` (children, their children, ...), deepest last."""
    found, frontier = [], children(pid)
    while frontier:
        found += frontier
        frontier = [grandchild for child in frontier for grandchild in children(child)]
    return found
