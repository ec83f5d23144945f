"""Asking for this process to be replaced by a fresh one (a task past its time limit: streams_app/tasks/timelimits.py).

The code that finds a reason (the tasks' watchdog) and the code that knows how (the runconsumer worker:
exit to its supervisor, or exec itself anew) are in layers that must not import each other; this
module is the meeting point below both. ``request`` does not return when a replacer is installed.
"""
import threading

_replacer = None
_lock = threading.Lock()


def install(replacer):
    """``replacer(reason)`` replaces the process (never returns); None: this process cannot be replaced."""
    global _replacer
    _replacer = replacer


def request(reason):
    """Replace this process, giving ``reason``; False (at once) when nothing can replace it."""
    replacer = _replacer
    if replacer is None:
        return False
    with _lock:  # two watches expiring together: one replacement
        replacer(reason)
    return True
