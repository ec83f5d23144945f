"""TERM and INT that arrive before a long-running command has its own handlers in place.

Django takes a second or more to start on a loaded host. Until the command installs its handlers a
TERM would either kill it without a drain or, as PID 1 of a container (where the kernel ignores
signals that have no handler), be dropped: Kubernetes then waits the whole grace period and SIGKILLs.
``catch()`` runs first thing in ``manage.py``; the command calls ``take()`` once its own handlers
are installed and acts on what arrived. A second signal of the same kind before that means "now":
the default action is restored and the signal raised again.
"""
import os
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_pending = []


def _record(signum, frame):
    if signum in _pending:
        signal.signal(signum, signal.SIG_DFL)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)
        # As PID 1 the default action of TERM is to do nothing: leave.
        os._exit(128 + signum)
    _pending.append(signum)


def catch():
    for signum in STOP_SIGNALS:
        signal.signal(signum, _record)


def take():
    """The stop signals received so far, oldest first; forgets them."""
    pending = list(_pending)
    _pending.clear()
    return pending
