"""TERM and INT that arrive before a long-running command has its own handlers in place.

Django takes a second or more to start on a loaded host. Until the command installs its handlers a
TERM would either kill it without a drain or, as PID 1 of a container (where the kernel ignores
signals that have no handler), be dropped: Kubernetes then waits the whole grace period and SIGKILLs.
``catch()`` runs first thing in ``manage.py``; the command calls ``take()`` once its own handlers
are installed and acts on what arrived. A second signal of the same kind before that means "now":
exit 2 (EXIT_FORCED), as a second signal does later. Python itself needs some 20 ms to reach
``manage.py``: a TERM before that is the kernel's (dropped by a PID 1), which only an init
process in front of Python (tini, ``docker run --init``) can catch.
"""
import os
import signal

from shoal_common.exitcodes import EXIT_FORCED

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_pending = []


def _record(signum, frame):
    if signum in _pending:
        # The second TERM/INT means "now", as it does once the consumers run (exit 2, EXIT_FORCED).
        os._exit(EXIT_FORCED)
    _pending.append(signum)


def catch():
    for signum in STOP_SIGNALS:
        signal.signal(signum, _record)


def pending():
    """True once a stop signal has arrived that nobody has taken yet (a wait at start-up stops on it)."""
    return bool(_pending)


def take():
    """The stop signals received so far, oldest first; forgets them."""
    pending = list(_pending)
    _pending.clear()
    return pending
