"""gunicorn's master for Shoal's web tier, changed in two ways: a HUP stops an old worker only once a
new one has loaded the app, and code that cannot load never takes the serving workers down.

gunicorn's own HUP forks the new workers and stops the old ones at once. With ``preload_app`` off a
new worker needs a second or two to import Django, and requests waited that long. Here each worker
tells the master through a pipe when it has loaded the app and its URLconf (``announce_ready`` from
``post_worker_init``); the master stops one old worker per ready new one, so as many workers as
configured are ready at every moment.

A worker that dies before it was ready could not load the app. gunicorn's master halts then, and the
serving workers go with it. Here, during a rollout, the rollout is aborted: the new workers are
stopped, the old ones keep serving, and the master logs an ERROR (the worker logged the traceback);
a later HUP with fixed code rolls forward. Outside a rollout (a worker recycled by ``max_requests``
whose replacement cannot load the code now on disk) the master waits before forking again, 1 s
doubling to 30 s. Only when no worker was ever ready, on the first start, does it halt, as gunicorn
does. Once a worker has been ready, a new worker not ready within twice ``timeout`` is killed and
counts as failed (gunicorn's own timeout only runs once a worker serves).

Recycling by ``max_requests`` is the master's too: a worker past its ``max_requests`` says so
(``ask_recycling``) and goes on serving; the master forks its replacement, one at a time, and stops the
old worker only once the replacement is ready, as in a rollout. gunicorn lets the worker exit first:
with code on disk that cannot load (a deploy written, its HUP not sent yet) both workers of a small
instance reached their limit within a second, exited, and were replaced by workers that could not boot:
nothing served. Here a replacement that cannot load holds recycling (shoal_common/web_recycling.py) at
once, and the workers still serving keep the code they loaded, for as long as the fix takes.

The master stays single-threaded, so that it never forks with a thread of ours running: its companions
(the discovery registration supervisor) are looked after from this loop, ``tick()`` on each pass and
``begin_stop()`` when the master stops, rather than from threads of their own.

gunicorn has no setting for the arbiter class, so ``install`` (from gunicorn.conf.py's
``on_starting``) changes the class of the running Arbiter. Written against gunicorn 27.0
(requirements.txt pins it): ``reload`` repeats the first half of gunicorn's own.

Each worker also gets a slot, the smallest number no live worker holds: a label for per-worker
metrics that stays within 0..2×workers however many workers come and go (pids would not).

No Django here: gunicorn's master imports this module, and the workers inherit what it imported.
"""
import itertools
import os
import signal
import sys
import time

from gunicorn import sock, util
from gunicorn.arbiter import Arbiter
from gunicorn.errors import HaltServer
from gunicorn.pidfile import Pidfile

from shoal_common import web_recycling

BOOT_FAILED = 75
"""A worker's exit code when it could not load the app (gunicorn's own 3 and 4 halt its master)."""
BACKOFF = (1.0, 30.0)

_ready_w = None  # the write end of the master's readiness pipe; every worker inherits it
_slot = None  # this worker's slot, set after the fork


def install(server):
    server.__class__ = ShoalArbiter
    server.shoal_setup()


def worker_slot():
    """This worker's slot (0, 1, ...), or None outside a gunicorn worker of ours."""
    return _slot


def child_started(server, worker):
    """In a worker just forked (post_fork): learn its slot, and exit with BOOT_FAILED, not with
    gunicorn's halting codes, when it cannot load the app."""
    global _slot
    _slot = getattr(server, "next_slot", None)
    boot = worker.init_process

    def init_process():
        try:
            boot()
        except SystemExit:
            raise
        except BaseException:
            if worker.booted:
                raise
            worker.log.exception("Worker (pid:%s) could not load the application", os.getpid())
            for listener in getattr(worker, "sockets", ()):  # the inherited listening sockets: closed, not warned about
                try:
                    listener.close()
                except OSError:
                    pass
            sys.exit(BOOT_FAILED)

    worker.init_process = init_process


def announce_ready():
    """In a worker whose app is loaded: tell the master, which may now stop an old worker."""
    if _ready_w is not None:
        os.write(_ready_w, f"{os.getpid()}\n".encode())


def ask_recycling():
    """In a worker past its ``max_requests``: ask the master to replace it. True when a master of ours
    heard (the worker then goes on serving until the master stops it), False outside one (gunicorn's own
    recycling applies: the worker exits by itself)."""
    if _ready_w is None:
        return False
    os.write(_ready_w, f"due {os.getpid()}\n".encode())  # one write below PIPE_BUF: never interleaved
    return True


class ShoalArbiter(Arbiter):
    def shoal_setup(self):
        global _ready_w
        self._ready_r, _ready_w = os.pipe()
        os.set_blocking(self._ready_r, False)
        self._partial = b""
        self.ready = set()  # pids that announced they are ready
        self.retiring = set()  # pids a rollout stops, each once a new worker is ready
        self.draining = set()  # pids sent TERM by us
        self.spawned_at = {}
        self.slots = {}
        self.next_slot = None
        self.ever_ready = False
        self.spawn_after = 0.0
        self.backoff = BACKOFF[0]
        self.failed_at = None  # when the last failed boot doubled the back-off
        self.due = {}  # pid -> when it reached max_requests: replaced (recycled) one at a time
        self.due_warned = set()  # those of them logged as kept serving while recycling is held
        self.replacing = {}  # pid of a replacement not ready yet -> pid of the worker past max_requests it replaces
        self.rollout_started = None  # a rollout (HUP) is under way while set
        self.stopping = False
        self.companions = []  # objects with tick() and begin_stop(), run from this loop
        self._reaped = set()  # the workers reap_workers found gone in its current pass
        self.recycling = web_recycling.Hold(web_recycling.status_path(), self.log)
        self.recycling.write()  # a previous master's hold is not ours

    # -- readiness ---------------------------------------------------------------------------

    def _read_ready(self):
        while True:
            try:
                data = os.read(self._ready_r, 4096)
            except BlockingIOError:
                break
            if not data:
                break
            self._partial += data
        *lines, self._partial = self._partial.split(b"\n")
        for line in lines:
            if line.startswith(b"due "):
                self._due(int(line[4:]))
                continue
            pid = int(line)
            if pid in self.WORKERS and pid not in self.ready:
                self.ready.add(pid)
                self.ever_ready = True
                self.backoff = BACKOFF[0]
                self.failed_at = None
                self.log.info("Worker (pid:%s) is ready (app loaded in %.1f s).", pid,
                              time.monotonic() - self.spawned_at.get(pid, time.monotonic()))
                replaced = self.replacing.pop(pid, None)
                if replaced is not None and replaced in self.WORKERS and replaced not in self.draining:
                    self.log.info("Worker (pid:%s) recycled after max_requests: worker (pid:%s) serves in its place.",
                                  replaced, pid)
                    self._retire(replaced)
                # Not while a rollout runs (its old workers stay the fallback until it completes), nor for
                # one stopped by an aborted rollout, which may still say ready.
                if self.rollout_started is None and pid not in self.draining:
                    self.recycling.release(f"worker (pid:{pid}) loaded the application")

    def _due(self, pid):
        if pid not in self.WORKERS or pid in self.draining or pid in self.due:
            return
        self.due[pid] = time.monotonic()
        self._warn_due_held()

    def _warn_due_held(self):
        """Once per worker past max_requests, when recycling is held (not for a rollout under way, which
        replaces them anyway): it goes on serving the old code, and the operator should know why."""
        if not self.recycling.held:
            self.due_warned.clear()  # a later hold says it again
            return
        if self.rollout_started is not None:
            return
        for pid in self.due:
            if pid not in self.due_warned and pid in self.WORKERS and pid not in self.draining:
                self.due_warned.add(pid)
                self.log.warning("Worker (pid:%s) reached max_requests while the master holds recycling (%s): it "
                                 "keeps serving with the code it loaded.", pid, self.recycling.reason)

    # -- spawning, reloading, retiring -------------------------------------------------------

    def spawn_worker(self):
        used = {slot for pid, slot in self.slots.items() if pid in self.WORKERS}
        self.next_slot = next(i for i in itertools.count() if i not in used)
        pid = super().spawn_worker()  # only the master returns from here
        self.slots[pid] = self.next_slot
        self.spawned_at[pid] = time.monotonic()
        return pid

    def reload(self):
        # gunicorn 27.0's reload up to the workers: environment, config, logs, listeners, pidfile.
        self._stats["reloads"] += 1
        old_address = self.cfg.address
        for k in self.cfg.env:
            if k in self.cfg.env_orig:
                os.environ[k] = self.cfg.env_orig[k]
            else:
                os.environ.pop(k, None)
        self.app.reload()
        self.setup(self.app)
        self.log.reopen_files()
        if old_address != self.cfg.address:
            for lnr in self.LISTENERS:
                lnr.close()
            self.LISTENERS = sock.create_sockets(self.cfg, self.log)
            self.log.info("Listening at: %s", ",".join(str(lnr) for lnr in self.LISTENERS))
        self.cfg.on_reload(self)
        if self.pidfile is not None:
            self.pidfile.unlink()
        if self.cfg.pidfile is not None:
            self.pidfile = Pidfile(self.cfg.pidfile)
            self.pidfile.create(self.pid)
        util._setproctitle(f"master [{self.proc_name}]")
        # Then ours: every worker now serving is replaced, each only once a new one is ready.
        self.retiring = {pid for pid in self.WORKERS if pid not in self.draining}
        self.rollout_started = time.monotonic()
        # A new deploy is a new attempt: its first failure waits 1 s again, not what earlier failures doubled
        # the back-off to (a second aborted HUP said "Next attempt in 8 s" where the first said 2).
        self.spawn_after = 0.0
        self.backoff = BACKOFF[0]
        self.failed_at = None
        # Every running worker is replaced now. One not ready yet (a recycling's replacement, a dead worker's)
        # is stopped at once: it loads the code of before the HUP, and its failure to boot is not this
        # rollout's (it aborted the HUP of fixed code). Those past max_requests stay due: if the rollout is
        # aborted they are still to be recycled (they asked once).
        self.replacing.clear()
        for pid in [pid for pid in self.retiring if pid not in self.ready]:
            self._retire(pid)
        # Under load the old workers reached max_requests while the new ones were still importing, and were
        # recycled into workers of the new code: when that code could not load, nothing was left to serve.
        self.recycling.hold("a rollout is under way", warn=False)
        serving = sum(pid in self.ready for pid in self.retiring)
        self.log.info("Rollout: starting %s workers with the code on disk; the %s serving now serve until "
                      "their replacements are ready.", self.num_workers, serving)
        self.manage_workers()

    def manage_workers(self):
        if self.stopping:
            return
        self._tick_companions()
        self._read_ready()
        self._kill_slow_boots()
        now = time.monotonic()
        live = [pid for pid in self.WORKERS if pid not in self.draining]
        retiring = [pid for pid in live if pid in self.retiring]
        current = [pid for pid in live if pid not in self.retiring]
        # A recycled worker's replacement, until it is ready, comes in addition to the worker it replaces.
        extra = [pid for pid in current if pid in self.replacing]
        missing = self.num_workers - (len(current) - len(extra))
        if missing > 0 and now >= self.spawn_after:
            for _ in range(missing):
                current.append(self.spawn_worker())
        if self.rollout_started is not None:
            ready = sum(pid in self.ready for pid in current)
            surplus = ready + len(retiring) - self.num_workers
            # Not-ready ones (left by an aborted rollout) first, then the oldest.
            order = sorted(retiring, key=lambda pid: (pid in self.ready, self.WORKERS[pid].age))
            for pid in order[:max(0, surplus)]:
                self._retire(pid)
            # Also when no old worker was left to stop (they had exited, been killed, or recycled meanwhile):
            # the rollout is complete once as many new workers as configured are ready.
            if surplus >= len(retiring):
                self.log.info("Rollout complete in %.1f s: %s workers run the new code.",
                              now - self.rollout_started, ready)
                self.retiring.clear()
                self.rollout_started = None
                self.recycling.release("the rollout is complete")
        elif len(current) - len(extra) > self.num_workers:  # TTOU
            surplus = len(current) - len(extra) - self.num_workers
            order = sorted((pid for pid in current if pid not in extra),
                           key=lambda pid: (pid not in self.due, self.WORKERS[pid].age))
            for pid in order[:surplus]:
                self._retire(pid)
        else:
            self._recycle(now)

    def _recycle(self, now):
        """Fork the replacement of the worker longest past its max_requests, one at a time; the worker is
        stopped once its replacement is ready (``_read_ready``), and keeps serving if it cannot load."""
        for pid in [pid for pid in self.due if pid not in self.WORKERS or pid in self.draining]:
            del self.due[pid]
        if not self.due or self.replacing or now < self.spawn_after:
            return
        old = min(self.due, key=self.due.get)
        new = self.spawn_worker()
        self.replacing[new] = old
        self.log.info("Worker (pid:%s) reached max_requests: worker (pid:%s) is starting to replace it; it serves "
                      "until then.", old, new)

    def _retire(self, pid):
        self.draining.add(pid)
        self.kill_worker(pid, signal.SIGTERM)

    def _kill_slow_boots(self):
        # Only once some worker was ready: on the first start there is nothing to fall back to, and a
        # slow machine is no reason to halt.
        if not self.ever_ready:
            return
        # Stopped ones too: a worker still loading the app only notes a TERM (its handler sets a flag),
        # and one stuck in its import would never exit; gunicorn's own timeout does not cover it.
        now, limit = time.monotonic(), 2 * self.timeout
        for pid in list(self.WORKERS):
            if pid in self.ready or now - self.spawned_at.get(pid, now) <= limit:
                continue
            self.log.error("Worker (pid:%s) did not load the application within %s s; killing it.", pid, limit)
            self.spawned_at[pid] = float("inf")  # once
            self.kill_worker(pid, signal.SIGKILL)

    # -- workers that exit -------------------------------------------------------------------

    def reap_workers(self):
        before = set(self.WORKERS)
        try:
            super().reap_workers()
        finally:
            self._reaped = before - set(self.WORKERS)
            for pid in sorted(self._reaped):
                self._worker_gone(pid)
            self._reaped = set()

    def halt(self, reason=None, exit_status=0):
        self._stop_companions()  # before gunicorn stops its control socket, which may take 2 s
        super().halt(reason, exit_status)

    def stop(self, graceful=True):
        self.stopping = True
        self._stop_companions()
        super().stop(graceful)

    # -- companions ---------------------------------------------------------------------------

    def _stop_companions(self):
        # Before gunicorn closes the listeners and drains: discovery must stop sending traffic here first.
        for companion in self.companions:
            self._guarded(companion.begin_stop)

    def _tick_companions(self):
        for companion in self.companions:
            self._guarded(companion.tick)

    def _guarded(self, call):
        # A companion's failure (registration cannot be restarted) must not take the serving master down.
        try:
            call()
        except Exception:
            self.log.exception("%s failed", getattr(call, "__qualname__", call))

    def _worker_gone(self, pid):
        self.slots.pop(pid, None)
        spawned_at = self.spawned_at.pop(pid, None)
        replaced = self.replacing.pop(pid, None)
        self.due.pop(pid, None)
        self.due_warned.discard(pid)
        for new, old in list(self.replacing.items()):
            if old == pid:  # the worker being replaced went first: its replacement is an ordinary worker now
                del self.replacing[new]
        was_ready, stopped = pid in self.ready, pid in self.draining
        self.ready.discard(pid)
        self.draining.discard(pid)
        self.retiring.discard(pid)
        if was_ready or stopped or self.stopping:
            return
        # It died before it was ready: it could not load the app (its traceback is in the log above).
        if not self.ever_ready:
            raise HaltServer("No worker could load the application (see the traceback above).",
                             self.WORKER_BOOT_ERROR)
        # Workers forked together fail together: one failed attempt doubles the back-off once, not once per worker
        # (two workers of a rollout said "Next attempt in 1 s", then "in 2 s", and the next HUP "in 8 s").
        if self.failed_at is None or spawned_at is None or spawned_at > self.failed_at:
            if self.failed_at is not None:
                self.backoff = min(BACKOFF[1], self.backoff * 2)
            self.failed_at = time.monotonic()
        self.spawn_after = time.monotonic() + self.backoff
        # Only workers that loaded the app serve; draining ones are on their way out.
        serving = [p for p in self.WORKERS if p in self.ready and p not in self.draining]
        if self.rollout_started is not None:
            reason = f"a rollout was aborted: worker (pid:{pid}) could not load the application"
            for other in [p for p in self.WORKERS if p not in self.retiring and p not in self.ready
                          and p not in self.draining]:
                self._retire(other)
            # New workers of this rollout reaped in the same pass failed with it: one abort, not an abort and
            # then "a replacement worker failed" for each of the others (with its own count and delay).
            self.draining.update(p for p in self._reaped if p not in self.ready and p != pid)
            serving = [p for p in self.WORKERS if p in self.ready and p not in self.draining]
            if serving:
                self.log.error("ROLLOUT ABORTED: a new worker (pid:%s) could not load the application (traceback "
                               "above). The %s workers already running keep serving; fix the code and send HUP "
                               "again.", pid, len(serving))
            else:
                self.log.critical("ROLLOUT ABORTED: a new worker (pid:%s) could not load the application (traceback "
                                  "above), and NO WORKER IS SERVING: none was left with the previous code. Fix the "
                                  "code and send HUP again. Next attempt in %.0f s.", pid, self.backoff)
            self.retiring.clear()
            self.rollout_started = None
        elif replaced is not None:
            reason = (f"worker (pid:{pid}), replacing worker (pid:{replaced}) past max_requests, could not load "
                      "the application")
            self.log.error("Worker (pid:%s), started to replace worker (pid:%s) past max_requests, could not load "
                           "the application (traceback above); the %s workers serving keep the code they loaded. "
                           "Next attempt in %.0f s.", pid, replaced, len(serving), self.backoff)
        else:
            reason = f"a replacement worker failed: worker (pid:{pid}) could not load the application"
            if serving:
                self.log.error("Worker (pid:%s) could not load the application (traceback above); the %s other "
                               "workers keep serving. Next attempt in %.0f s.", pid, len(serving), self.backoff)
            else:
                # The last old worker went (killed, crashed: recycling alone no longer takes it, it is held)
                # and the code on disk cannot load: nothing serves. Say so as loudly as a log can, at every attempt.
                self.log.critical("NO WORKER IS SERVING: worker (pid:%s) could not load the application "
                                  "(traceback above) and no worker with the previous code is left. Requests wait "
                                  "or fail until the code on disk is fixed and HUP is sent. Next attempt in %.0f s.",
                                  pid, self.backoff)
        self.recycling.hold(reason)
        self._warn_due_held()  # those that reached max_requests before the hold (during the aborted rollout)
