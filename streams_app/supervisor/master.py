"""The runconsumer master: keeps a pool of worker processes, in the manner of gunicorn's arbiter.

The master never consumes. Signal handlers only put the signal on a queue; ``run()`` is a short
loop around ``tick(now)``, which dispatches queued signals to ``handle_<name>()``, reaps exited
workers, kills those whose heartbeat went stale, follows the backlog, steps a rolling restart,
brings the worker count to the desired one and enqueues the due periodic tasks (``scheduler``). Tests drive ``tick()`` with an injected ``now``.

Workers are started by a spawner (``streams_app.supervisor.spawn``): fresh interpreters, so a HUP loads new
handler code; with --preload, forks of a zygote (``streams_app.supervisor.preload``), whose HUP starts a
new zygote on the new code. A worker that fails to boot exits with EXIT_BOOT_ERROR and halts the master
(HaltServer) instead of being respawned forever; so do CRASH_LIMIT crashes within CRASH_WINDOW.
"""
import logging
import os
import queue
import signal
import time
from collections import deque

from setproctitle import setproctitle

from shoal_common import early_signals, logformat
from shoal_common.exitcodes import EXIT_CRASH, EXIT_FORCED, EXIT_OK, EXIT_REPLACED
from streams_app.supervisor.worker_main import EXIT_BOOT_ERROR

logger = logging.getLogger("streams_app.supervisor")

# The master's exit codes (shoal_common.exitcodes): EXIT_OK; EXIT_CRASH_LOOP, workers kept crashing
# (let systemd / Kubernetes see it); EXIT_FORCED, a second TERM/INT told the workers to stop at once;
# EXIT_BOOT_ERROR, a worker could not boot (bad settings, ImportError in a consumers.py).
EXIT_CRASH_LOOP = EXIT_CRASH

STOP_GRACE = 5.0
"""Seconds a stopping worker gets beyond the shutdown timeout (to ack and exit) before SIGKILL."""
FORCED_STOP_GRACE = 1.0
"""Seconds a worker told to stop at once gets before SIGKILL."""
MAX_RESTART_DELAY = 30.0
FAST_TICK = 0.1  # while workers boot or stop, a rollout runs, or a restart is due
SLOW_TICK = 1.0

SIGNALS = ("SIGHUP", "SIGINT", "SIGTERM", "SIGTTIN", "SIGTTOU", "SIGCHLD")


class HaltServer(BaseException):
    """Carries "stop the pool and exit with ``exit_code``" up to the loop; never respawn past it."""

    def __init__(self, reason, exit_code):
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code


class WorkerProcess:
    """The master's view of one worker process."""

    def __init__(self, number, proc, heartbeat, now):
        self.number = number
        self.proc = proc
        self.pid = proc.pid
        self.heartbeat = heartbeat
        self.started_at = now
        self.ready = False  # has beaten once: booted and consuming
        self.stopping = False  # told to stop (TERM or KILL) by the master
        self.kill_at = None  # SIGKILL if still alive then
        self.killed = False
        self.kill_reason = None  # the master killed it for a fault: counts as a crash
        self.replaces = None  # pid of the old worker this one replaces during a rolling restart

    def signal(self, sig):
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError:
            pass  # exited already; the next reap collects it

    def __str__(self):
        return f"{self.number} (pid {self.pid})"


class Supervisor:
    def __init__(self, spawner, *, workers=1, autoscaler=None, lag_reader=None, lag_interval=None,
                 shutdown_timeout=30.0, heartbeat_timeout=60.0, restart_delay=1.0, crash_limit=10,
                 crash_window=600.0, metrics=None, label="", clock=time.monotonic, set_title=setproctitle,
                 reap_orphans=None, scheduler=None):
        self.spawner = spawner
        self.autoscaler = autoscaler
        self.desired = autoscaler.minimum if autoscaler else workers
        self.minimum = autoscaler.minimum if autoscaler else 1
        self.maximum = autoscaler.maximum if autoscaler else None
        self.lag_reader = lag_reader
        self.lag_interval = autoscaler.interval if autoscaler else lag_interval
        self.shutdown_timeout = shutdown_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.restart_delay = restart_delay
        self.crash_limit = crash_limit
        self.crash_window = crash_window
        self.metrics = metrics
        # The periodic tasks of the queues this pool runs (streams_app.tasks.periodic): enqueued from this
        # loop, about once a second, however busy the workers are. It keeps its own wall clock (ticks are
        # wall times) and never raises for Redis or a task that cannot be enqueued.
        self.scheduler = scheduler
        self.label = label
        # Heartbeats carry this clock's readings too (CLOCK_MONOTONIC is one clock for every process
        # of the host): a wall-clock step (NTP, VM resume) neither kills healthy workers as stuck nor
        # delays replacing a stuck one.
        self.clock = clock
        self.set_title = set_title
        # As PID 1 (a container's entry point) every orphan of the namespace becomes our child: a
        # handler's subprocess whose worker was SIGKILLed stays a zombie until we wait for it.
        # A subreaper (the --preload spawner) adopts them too, wherever we run.
        if reap_orphans is None:
            reap_orphans = os.getpid() == 1 or getattr(spawner, "subreaper", False)
        self.reap_orphans = reap_orphans

        self.workers = {}  # pid -> WorkerProcess
        self.signals = queue.SimpleQueue()
        self._received = deque()  # taken off the queue while waiting, dispatched by the next tick
        self.crashes = deque()  # times of recent crashes
        self.next_spawn_at = 0.0
        self.next_lag_at = 0.0
        self.lag_failing = False
        self.reload_queue = []  # pids of workers still to be replaced by a rolling restart
        self.stopping = False
        self.exit_code = None
        self.done = False
        self.spawned = 0
        self._title = None
        if hasattr(spawner, "interrupted"):
            spawner.interrupted = self.stop_requested

    # -- the loop ---------------------------------------------------------------------------

    def run(self):
        logformat.set_context(selector=self.label or None)
        self.install_signals()
        logger.info("Supervisor: started (%s); %s", self.label or "all consumers", self.describe_target())
        if self.scheduler is not None:
            logger.info("Supervisor: schedules %s", self.scheduler.describe())
        try:
            while not self.done:
                self.tick()
                if not self.done:
                    self.wait(self.tick_seconds())
        finally:
            self._spawner_hook("close")
        logger.info("Supervisor: stopped (exit %d)", self.exit_code)
        return self.exit_code

    def tick(self, now=None):
        now = self.clock() if now is None else now
        try:
            self.dispatch_signals(now)
            self.reap(now)
            if not self.stopping:
                self.check_heartbeats(now)
                self.follow_backlog(now)
                self.roll(now)
                self.manage_workers(now)
                self.schedule_periodic()
        except HaltServer as halt:
            logger.error("Supervisor: %s", halt.reason)
            self.begin_stop(now, halt.exit_code)
        self.enforce_kills(now)
        if self.stopping and not self.workers:
            self.done = True
        self.report()

    def wait(self, timeout):
        try:
            self._received.append(self.signals.get(timeout=timeout))
        except queue.Empty:
            pass

    def tick_seconds(self):
        now = self.clock()
        busy = self.stopping or self.reload_queue or any(not w.ready or w.stopping for w in self.workers.values())
        if busy:
            return FAST_TICK
        if self.count_active() < self.desired:  # a restart is due when its delay is over
            return min(SLOW_TICK, max(FAST_TICK, self.next_spawn_at - now))
        return SLOW_TICK

    # -- signals ----------------------------------------------------------------------------

    def install_signals(self):
        for name in SIGNALS:
            signal.signal(getattr(signal, name), self._on_signal)
        for signum in early_signals.take():  # a TERM that came during start-up
            self.signals.put(signum)

    def stop_requested(self):
        """Whether a TERM/INT waits (moved off the queue, still dispatched in order by the next tick)."""
        while True:
            try:
                self._received.append(self.signals.get_nowait())
            except queue.Empty:
                break
        return self.stopping or any(s in (signal.SIGTERM, signal.SIGINT) for s in self._received)

    def _on_signal(self, signum, frame):
        self.signals.put(signum)  # reentrant: safe in a signal handler

    def dispatch_signals(self, now):
        while True:
            if self._received:
                signum = self._received.popleft()
            else:
                try:
                    signum = self.signals.get_nowait()
                except queue.Empty:
                    return
            handler = getattr(self, f"handle_{signal.Signals(signum).name[3:].lower()}", None)
            if handler is not None:
                handler(now)

    def handle_term(self, now, name="SIGTERM"):
        if self.stopping:
            self.stop_at_once(now, name)
        else:
            logger.info("Supervisor: %s received; stopping %d workers gracefully (up to %ss)",
                        name, len(self.workers), self.shutdown_timeout)
            self.begin_stop(now, EXIT_OK)

    def handle_int(self, now):
        self.handle_term(now, "SIGINT")

    def handle_hup(self, now):
        if self.stopping:
            return
        # A rollout's extra worker counts too: a HUP during a rollout must not leave it on the code the
        # previous HUP loaded (or, with --preload, forked from the previous zygote).
        running = [w for w in self.workers.values() if not w.stopping]
        self.reload_queue = [w.pid for w in sorted(running, key=lambda w: w.started_at)]
        logger.info("Supervisor: SIGHUP received; rolling restart of %d workers, one at a time", len(self.reload_queue))
        self._spawner_hook("reload")

    def _spawner_hook(self, name, *args):
        """Optional spawner methods (streams_app.supervisor.preload's): ``reload``, ``reap``, ``close``."""
        hook = getattr(self.spawner, name, None)
        return hook(*args) if hook is not None else None

    def handle_ttin(self, now):
        self.resize(self.desired + 1, "SIGTTIN")

    def handle_ttou(self, now):
        self.resize(self.desired - 1, "SIGTTOU")

    def handle_chld(self, now):
        """Only wakes the loop: every tick reaps."""

    def resize(self, wanted, why):
        bounded = max(self.minimum, wanted if self.maximum is None else min(self.maximum, wanted))
        if bounded != wanted:
            logger.info("Supervisor: %s: already at %d workers, the %s", why, self.desired,
                        "minimum" if wanted < self.minimum else "maximum")
        elif self.stopping:
            return
        else:
            logger.info("Supervisor: %s: workers %d -> %d", why, self.desired, bounded)
        self.desired = bounded

    # -- workers ----------------------------------------------------------------------------

    def active(self):
        """Workers counted towards the desired number: not stopping, not a rollout's extra one."""
        return [w for w in self.workers.values() if not w.stopping and w.replaces is None]

    def count_active(self):
        return len(self.active())

    def spawn(self, now):
        self.spawned += 1
        try:
            proc, heartbeat = self.spawner(self.spawned)
        except OSError as exc:
            logger.error("Supervisor: could not start worker %d: %s", self.spawned, exc)
            self.record_crash(now)
            return None
        worker = WorkerProcess(self.spawned, proc, heartbeat, now)
        self.workers[worker.pid] = worker
        logger.info("Supervisor: spawned worker %s", worker)
        return worker

    def stop_worker(self, worker, now, why):
        if worker.stopping:
            return
        logger.info("Supervisor: stopping worker %s (%s)", worker, why)
        worker.stopping = True
        worker.kill_at = now + self.shutdown_timeout + STOP_GRACE
        worker.signal(signal.SIGTERM)

    def kill_worker(self, worker, reason):
        logger.error("Supervisor: killing worker %s: %s", worker, reason)
        worker.stopping = True
        worker.kill_reason = reason
        worker.killed = True
        worker.signal(signal.SIGKILL)

    def manage_workers(self, now):
        active = self.active()
        if len(active) < self.desired and now >= self.next_spawn_at:
            for _ in range(self.desired - len(active)):
                self.spawn(now)
        elif len(active) > self.desired:
            # Booting ones first (they hold nothing), then the oldest (likely to run the oldest code).
            for worker in sorted(active, key=lambda w: (w.ready, w.started_at))[: len(active) - self.desired]:
                self.stop_worker(worker, now, f"scaling to {self.desired}")

    def reap(self, now):
        for worker in list(self.workers.values()):
            code = worker.proc.poll()
            if code is None:
                continue
            del self.workers[worker.pid]
            worker.heartbeat.close()
            if self.metrics is not None:
                self.metrics.worker_exited(worker.pid)
            self.on_exit(worker, code, now)
        self._spawner_hook("reap")
        if self.reap_orphans:
            self.reap_other_children()

    def reap_other_children(self):
        """Wait for exited children that are not workers; a worker's exit status stays for ``reap``."""
        while True:
            try:
                # WNOWAIT peeks: waiting for a worker here would hide its exit status from its Popen.
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0 or info.si_pid in self.workers or self._spawner_hook("owns", info.si_pid):
                return  # nothing exited, or a worker (or zygote) that the next reap collects
            try:
                os.waitpid(info.si_pid, os.WNOHANG)
            except ChildProcessError:
                return
            logger.debug("Supervisor: reaped orphaned process %s", info.si_pid)

    def on_exit(self, worker, code, now):
        how = f"exit {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
        if self.stopping or (worker.stopping and worker.kill_reason is None):
            logger.info("Supervisor: worker %s stopped (%s)", worker, how)
            return
        if code == EXIT_BOOT_ERROR and worker.replaces is not None and worker.replaces in self.workers:
            # A bad deploy seen at HUP: the workers on the previous code are still consuming; keep them.
            logger.error("Supervisor: worker %s failed to boot (%s); rolling restart aborted, %d workers keep "
                         "running the previous code. Fix the cause above, then send SIGHUP again.",
                         worker, how, self.count_active())
            self.reload_queue = []
            return
        if code == EXIT_BOOT_ERROR:
            raise HaltServer(
                f"worker {worker} failed to boot ({how}); see its error above. Not starting it again: "
                f"fix the cause, then start runconsumer again.", EXIT_BOOT_ERROR,
            )
        if code == 0 and worker.kill_reason is None:
            logger.warning("Supervisor: worker %s exited on its own (%s); replacing it", worker, how)
            return
        if code == EXIT_REPLACED and worker.kill_reason is None:
            # A task ran past its timeout (streams_app/tasks/timelimits.py): the worker asked for a fresh
            # process. Not a crash: a timeout is the task's failure, recorded on its result.
            logger.warning("Supervisor: worker %s asked to be replaced (a task ran past its timeout); replacing it",
                           worker)
            return
        delay = self.record_crash(now)
        logger.warning("Supervisor: worker %s crashed (%s%s); replacing it in %.1fs", worker, how,
                       f", {worker.kill_reason}" if worker.kill_reason else "", delay)

    def record_crash(self, now):
        """Count a crash; return the restart delay, or halt after too many crashes in the window."""
        self.crashes.append(now)
        while self.crashes and self.crashes[0] <= now - self.crash_window:
            self.crashes.popleft()
        if len(self.crashes) >= self.crash_limit:
            raise HaltServer(
                f"{len(self.crashes)} worker crashes within {self.crash_window:.0f}s; giving up so that "
                f"systemd/Kubernetes sees the failure. See the workers' errors above.", EXIT_CRASH_LOOP,
            )
        delay = min(MAX_RESTART_DELAY, self.restart_delay * 2 ** (len(self.crashes) - 1))
        self.next_spawn_at = max(self.next_spawn_at, now + delay)
        return delay

    def check_heartbeats(self, now):
        for worker in list(self.workers.values()):
            if worker.stopping:
                continue
            beat = worker.heartbeat.last_beat()
            if not worker.ready:
                if beat > 0:
                    worker.ready = True
                    logger.info("Supervisor: worker %s is consuming", worker)
                elif now - worker.started_at > self.heartbeat_timeout:
                    self.kill_worker(worker, f"not booted after {self.heartbeat_timeout:.0f}s")
            elif now - beat > self.heartbeat_timeout:
                self.kill_worker(worker, f"no heartbeat for {now - beat:.0f}s (a handler stuck?)")

    def enforce_kills(self, now):
        for worker in self.workers.values():
            if worker.kill_at is not None and now >= worker.kill_at and not worker.killed:
                logger.warning("Supervisor: worker %s did not stop in time; killing it", worker)
                worker.killed = True
                worker.signal(signal.SIGKILL)

    # -- rolling restart --------------------------------------------------------------------

    def roll(self, now):
        """One step of a HUP: start a replacement, and stop the old worker once the new one consumes."""
        if not self.reload_queue:
            return
        surge = next((w for w in self.workers.values() if w.replaces is not None), None)
        if surge is None:
            self.reload_queue = [pid for pid in self.reload_queue if pid in self.workers and not self.workers[pid].stopping]
            if not self.reload_queue:
                logger.info("Supervisor: rolling restart complete")
            elif now >= self.next_spawn_at:
                new = self.spawn(now)
                if new is not None:
                    new.replaces = self.reload_queue[0]
        elif surge.ready:
            old = self.workers.get(surge.replaces)
            surge.replaces = None
            if old is not None:
                if old.pid in self.reload_queue:
                    self.reload_queue.remove(old.pid)
                self.stop_worker(old, now, f"replaced by worker {surge}")
            if not self.reload_queue:
                logger.info("Supervisor: rolling restart complete")

    # -- stopping ---------------------------------------------------------------------------

    def begin_stop(self, now, exit_code):
        self.stopping = True
        self.reload_queue = []
        if self.exit_code is None:
            self.exit_code = exit_code
        for worker in list(self.workers.values()):
            self.stop_worker(worker, now, "supervisor stopping")

    def stop_at_once(self, now, name):
        logger.warning("Supervisor: second %s; stopping %d workers at once (unacknowledged entries stay pending)",
                       name, len(self.workers))
        self.exit_code = EXIT_FORCED
        for worker in self.workers.values():
            # The worker's second signal: it exits without waiting for its handlers.
            worker.signal(signal.SIGINT)
            worker.kill_at = min(worker.kill_at or now + FORCED_STOP_GRACE, now + FORCED_STOP_GRACE)

    # -- backlog and reporting --------------------------------------------------------------

    def schedule_periodic(self):
        if self.scheduler is not None:
            self.scheduler.tick()

    def follow_backlog(self, now):
        if self.lag_reader is None or now < self.next_lag_at:
            return
        self.next_lag_at = now + self.lag_interval
        try:
            lags = self.lag_reader()
        except Exception as exc:  # Redis down or the like: decide nothing rather than on a guess
            if not self.lag_failing:
                logger.warning("Supervisor: cannot read the backlog (%s); keeping %d workers", exc, self.desired)
            self.lag_failing = True
            return
        self.lag_failing = False
        if self.metrics is not None:
            self.metrics.set_lags(lags)
        if self.autoscaler is not None:
            total = sum(g.lag for g in lags)
            self.desired = self.autoscaler.apply(total, self.desired, now, estimated=any(g.estimated for g in lags))

    def describe_target(self):
        if self.autoscaler is None:
            return f"{self.desired} workers"
        a = self.autoscaler
        return f"{a.minimum}-{a.maximum} workers following the backlog (target lag {a.target}, every {a.interval}s)"

    def report(self):
        states = {"booting": 0, "consuming": 0, "stopping": 0}
        for w in self.workers.values():
            states["stopping" if w.stopping else "consuming" if w.ready else "booting"] += 1
        if self.metrics is not None:
            self.metrics.set_workers(self.desired, states)
        title = (f"shoal: runconsumer master [{self.label or 'all consumers'}] "
                 f"workers {states['consuming']}/{self.desired}"
                 + (f" booting {states['booting']}" if states["booting"] else "")
                 + (f" stopping {states['stopping']}" if states["stopping"] else ""))
        if title != self._title:
            self.set_title(title)
            self._title = title
