"""Whether the gunicorn workers may be recycled now: held while the code on disk is known not to load.

gunicorn recycles a worker after ``max_requests`` (leaks in third-party code) by letting it exit and
forking a new one, which imports the code now on disk. When that code cannot load (a rollout aborted, or
a deploy written whose HUP is not sent yet), every recycling replaced a working worker with one that could
not boot, and the site stopped. Here the master recycles (shoal_common/web_rollout.py): a worker past its
``max_requests`` serves on until its replacement is ready. From a HUP until its rollout completes, and
from the moment a worker fails to load the app until one loads it (a rollout succeeds, or the code on
disk is fixed), the master *holds* recycling: the workers past ``max_requests`` keep serving with the
code they loaded (a replacement is tried again after a back-off, 1 s doubling to 30 s), and the hold
shows in the log, in ``/metrics`` (``shoal_web_recycling_held``) and in ``/readyz`` (``web_rollout``).

The master writes the state to a small JSON file (``SHOAL_WEB_ROLLOUT_STATUS``, beside the
registration's), which the workers read for ``/readyz`` and ``/metrics``.

No Django here: gunicorn's master imports this module.
"""
import json
import os
import tempfile
import time

STATUS_ENV = "SHOAL_WEB_ROLLOUT_STATUS"
"""Environment variable naming the JSON file where the master says whether recycling is held
(workers and /readyz inherit the variable from the master)."""

def status_path(environ=os.environ):
    return environ.get(STATUS_ENV) or None


def read_state(path=None):
    """The master's last word (``{"recycling": "held" or "normal", ...}``), or None without one."""
    path = path or status_path()
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"recycling": "unknown", "error": type(exc).__name__}


class Hold:
    """The master's side: says when recycling is held and when it is not any more."""

    def __init__(self, path, log):
        self.path = path
        self.log = log
        self.held_since = None
        self.reason = None

    @property
    def held(self):
        return self.held_since is not None

    def hold(self, reason, warn=True):
        """Hold (or go on holding, for a new reason). ``warn=False`` for the hold of a rollout under way,
        which is routine: its old workers are the fallback until the new ones are ready."""
        if self.held and reason == self.reason:
            return
        if not self.held:
            self.held_since = time.time()
        self.reason = reason
        if warn:
            self.log.warning("RECYCLING HELD: %s. Workers past max_requests keep serving with the code they "
                             "loaded until a worker loads the code on disk (fix it and send HUP).", reason)
        else:
            self.log.info("Recycling held: %s.", reason)
        self.write()

    def release(self, why):
        if not self.held:
            return
        self.log.info("Recycling resumed after %.0f s held: %s.", time.time() - self.held_since, why)
        self.held_since = self.reason = None
        self.write()

    def write(self):
        """Never raises (it runs in the master's loop): an unwritable file leaves the workers on the
        state they last read, and says so."""
        if not self.path:
            return
        state = {"recycling": "held" if self.held else "normal", "since": self.held_since, "reason": self.reason}
        tmp = None
        try:
            directory, name = os.path.split(self.path)
            fd, tmp = tempfile.mkstemp(prefix=f"{name}.", suffix=".tmp", dir=directory or ".")
            with os.fdopen(fd, "w") as f:
                json.dump(state, f)
            os.replace(tmp, self.path)  # readers never see half a file
        except OSError as exc:
            self.log.error("Could not write the recycling state to %s (%s): workers act on the one they "
                           "last read", self.path, exc)
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
