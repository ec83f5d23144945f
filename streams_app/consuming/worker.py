"""One consumer process: a read loop per group, a shared pool of handler threads, and signals.

Sync handlers run in the thread pool (``threads``); ``async def`` handlers on one event loop in a
thread of its own (streams_app.consuming.eventloop), at most ``concurrency`` at once. The read loops
treat both alike.

Signal handlers only put the signal on a queue; the main thread acts on it. The first TERM/INT
stops reading at once (blocked reads are cut short with CLIENT UNBLOCK) and lets in-flight
handlers finish until the shutdown timeout; the second exits at once. Either way unacknowledged
entries stay in the group's PEL, where another consumer takes them over.
"""
import gc
import logging
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import redis

from shoal_common import early_signals, logformat, replacement
from streams_app import broadcast, registry
from streams_app.partitioning import partitions

from streams_app.consuming import chunks, liveness
from shoal_common.exitcodes import EXIT_BURST_UNFINISHED, EXIT_CONFIG, EXIT_CRASH, EXIT_FORCED, EXIT_OK  # noqa: F401
from streams_app.conf import get_settings
from shoal_common.redis_errors import is_no_permission, is_oom
from streams_app.redis.connection import TRANSIENT_ERRORS, get_connection, node_client, reader_connection, recover
from streams_app.consuming import refusals
from streams_app.consuming.burst import BurstGate, BurstGaveUp
from streams_app.consuming.eventloop import EventLoopRunner
from streams_app.consuming.follow import LayoutFollower, respecify
from streams_app.consuming.groups import ensure_group
from streams_app.consuming.leases import LeaseTable
from streams_app.consuming.loop import GroupLoop
from streams_app.consuming.ordered import OrderedGroupLoop
from streams_app.consuming.naming import consumer_name
from streams_app.publishing.scheduled import Mover
from streams_app.consuming.outage import OutageLog

logger = logging.getLogger("streams_app.consumer")

# EXIT_CRASH: a read loop died of an unexpected error, let the supervisor replace the process;
# EXIT_FORCED: a second signal, stopped without waiting for handlers; EXIT_CONFIG: cannot start as
# configured, restarting would not help. (Re-exported here: runconsumer imports them from this module.)

# Without CLIENT UNBLOCK (a least-privilege Redis user) a stop waits for the blocked read to end:
# reads block at most this long then.
SHORT_BLOCK_MS = 500
# --burst: how long a read waits for a new entry before the burst counts the stream as done.
BURST_BLOCK_MS = 10
# --burst: a Redis unreachable this long (or the --burst-timeout, if shorter) ends the burst, exit 4.
BURST_REDIS_WAIT = 10.0


class Shutdown(threading.Event):
    """Set when the worker stops reading; ``deadline`` is when in-flight handlers are given up on."""

    deadline = float("inf")


class Worker:
    # Supervision hooks (streams_app.supervisor.worker_main): the class of the handler pool, so a supervised worker
    # can track handler progress, and ``heartbeat(worker)``, called on every pass of ``run()``.
    executor_class = ThreadPoolExecutor
    # How this process is replaced by a fresh one when a task runs past its time limit
    # (streams_app/tasks/timelimits.py): a supervised worker exits to its supervisor, runconsumer without
    # one execs itself; None (a Worker run in-process, e.g. by call_command): it cannot be.
    replace = None

    def __init__(self, specs, *, threads=None, batch=None, block_ms=None, shutdown_timeout=None, name=None,
                 clock=time.monotonic, heartbeat=None, concurrency=None, burst=False, burst_timeout=None,
                 scheduler=None):
        config = dict(get_settings())
        if batch is not None:
            config["BATCH_SIZE"] = batch
        if block_ms is not None:
            config["BLOCK_MS"] = block_ms
        self.config = config
        self.specs = respecify(list(specs))  # the live partition layout, not the one the caller saw
        self.follower = LayoutFollower(self.specs, clock)  # stops this worker when that layout changes
        self.threads = threads or config["THREADS"]
        self.concurrency = concurrency or config["ASYNC_CONCURRENCY"]
        self.event_loop = None  # an EventLoopRunner, made at boot when some handler is async
        self.shutdown_timeout = config["SHUTDOWN_TIMEOUT"] if shutdown_timeout is None else shutdown_timeout
        self.name = name or consumer_name()
        self.clock = clock
        self.shutdown = Shutdown()
        self.signals = queue.SimpleQueue()
        self.loops = []
        self.threads_ = []
        self.exit_code = EXIT_OK
        self.stuck = 0  # handler chunks still running after the shutdown timeout
        self.liveness_due = 0.0
        self.heartbeat = heartbeat
        self.can_unblock = True  # False when the Redis user may not run CLIENT LIST / CLIENT UNBLOCK
        self.leases = LeaseTable(self.name, config, clock)  # ordered consumers' partition leases
        self.mover = Mover(self.streams, config=config, clock=clock, name=self.name,  # deferred messages
                           refused=refusals.refused)
        self.outage = OutageLog()  # its read loops report a Redis outage once, not once each
        # runconsumer without a supervisor: the periodic tasks' scheduler (streams_app.tasks.periodic), whose
        # tick() this loop calls once per pass (at most a second apart, whatever the handlers do).
        self.scheduler = scheduler
        self.burst = burst  # handle what is there, then stop (runconsumer --burst)
        self.burst_timeout = burst_timeout  # seconds; None: no bound
        self.burst_deadline = float("inf")
        self.burst_left = None  # why the burst gave up, when it did

    # -- lifecycle --------------------------------------------------------------------------

    def run(self):
        """Consume until stopped; return the exit code."""
        # What start-up made (Django, the apps, the handlers' modules) lives as long as the process: out of the
        # cyclic collector's reach, it is not scanned again on every collection of the messages' short-lived
        # objects (bench/README.md, "Steady state and where the time goes": about a quarter of the CPU per
        # message). Before boot(), which starts the read loops: no handler runs before it.
        gc.collect()
        gc.freeze()
        if self.burst and self.burst_timeout is not None:
            self.burst_deadline = time.monotonic() + self.burst_timeout
        try:
            self.boot()
        except StoppedAtStart as stopped:
            logger.info("Consumer %s: %s received while waiting for Redis at start; stopped", self.name,
                        signal.Signals(stopped.signum).name)
            return EXIT_OK
        self.install_signals()
        if self.replace is not None:
            replacement.install(self.replace_process)
        # Every consumer process hears deployment-wide broadcasts (log level, cache invalidation).
        broadcast.start_listener()
        logger.info("Consumer %s: started (%s; %d handler threads%s)", self.name,
                    ", ".join(registry.selectors(self.specs)), self.threads,
                    f", {self.concurrency} concurrent async handlers" if self.event_loop else "")
        if self.scheduler is not None:
            logger.info("Consumer %s: schedules %s", self.name, self.scheduler.describe())
        while self.alive():
            if self.heartbeat is not None:
                self.heartbeat(self)
            self.renew_liveness()
            self.move_scheduled()
            if self.scheduler is not None and not self.shutdown.is_set():
                self.scheduler.tick()
            try:
                waiting = 0.1 if self.shutdown.is_set() or self.burst else self.mover.wait()
                signum = self.signals.get(timeout=waiting)
            except queue.Empty:
                signum = None
            if signum is not None:
                self.handle_signal(signum)
            self.check_loops()
            self.check_burst()
            self.follow_layout()
            if self.shutdown.is_set():
                self.unblock_readers()
        if any(getattr(loop, "crashed", None) is not None for loop in self.loops):
            self.exit_code = EXIT_CRASH  # also when the last loop died between two checks above
        self.stuck = sum(loop.busy_chunks for loop in self.loops if not loop.spec.is_async)
        self.executor.shutdown(wait=not self.stuck, cancel_futures=True)
        if self.event_loop is not None:
            self.stuck += self.event_loop.shutdown()
        self.leases.leave()  # the read loops have ended: release what they still hold, leave the members
        self.forget_liveness()
        broadcast.stop_listener()
        chunks.failure_log.flush()
        logger.info("Consumer %s: stopped (%d entries handled)", self.name, sum(loop.handled for loop in self.loops))
        return self.exit_code

    def boot(self):
        """Create groups up front, so a misconfigured stream fails the start instead of a thread."""
        logformat.set_context(consumer=self.name, selector=" ".join(spec.name for spec in self.specs))
        conn = self._connect()
        self.check_partitions(conn)
        for spec in self.specs:
            try:
                ensure_group(conn, spec.stream, spec.group, spec.start)
            except TRANSIENT_ERRORS as exc:
                logger.warning("Consumer %s: Redis unreachable at start (%s); the read loops will keep trying", self.name, exc)
                break
            except redis.ResponseError as exc:
                if not is_oom(exc):
                    raise
                refusals.refused("group", exc)  # the group's loop keeps trying to create it
        self.check_client_commands(conn)
        self.executor = self.executor_class(self.threads, thread_name_prefix="shoal-handler")
        gate = BurstGate(len(self.specs)) if self.burst else None
        if any(spec.is_async for spec in self.specs):
            self.event_loop = EventLoopRunner(self.concurrency)
        for spec in self.specs:
            loop_class, ordered = (OrderedGroupLoop, {"lease": self.leases.lease_for(spec)}) if spec.ordered else (GroupLoop, {})
            loop = loop_class(
                spec, self.name, conn=conn, reader=self._connect(self.reader_client_name), **ordered,
                executor=self.event_loop if spec.is_async else self.executor, threads=self.threads,
                shutdown=self.shutdown, config=self.config, clock=self.clock, concurrency=self.concurrency,
                outage=self.outage,
            )
            loop.peers = self.loops  # they share the handler pool: a chunk starts at once only if it is free
            if not self.can_unblock:
                loop.block_ms = min(loop.block_ms, SHORT_BLOCK_MS)
                loop.can_list_clients = False
            if self.burst:
                loop.burst = True
                loop.burst_gate = gate
                loop.block_ms = min(loop.block_ms, BURST_BLOCK_MS)
            thread = threading.Thread(target=self._run_loop, args=(loop,), name=f"shoal-read-{spec.name}", daemon=True)
            self.loops.append(loop)
            self.threads_.append(thread)
            thread.start()
        self.leases.start(conn, closing=self.shutdown)

    def check_client_commands(self, conn):
        """Find out once whether this Redis user may run CLIENT LIST (CLIENT UNBLOCK is in the same ACL
        categories, @admin @dangerous). Without them Shoal degrades, it does not fail: a stop waits for
        a short blocking read to end instead of cutting it short, and consumers known dead are taken
        over after the pending timeout instead of at once."""
        try:
            conn.client_list(_type="pubsub")
        except TRANSIENT_ERRORS:
            return
        except redis.ResponseError as exc:
            if not is_no_permission(exc):
                raise
            self.can_unblock = False
            logger.warning("Consumer %s: the Redis user may not run CLIENT LIST/CLIENT UNBLOCK (%s). Degraded: "
                           "reads block at most %d ms so a stop is not held up, and the entries of a consumer "
                           "known dead are taken over after PENDING_TIMEOUT_MS, not at once. Grant +client|list "
                           "+client|unblock to restore both (README \"Redis ACL\").", self.name, exc, SHORT_BLOCK_MS)

    def check_partitions(self, conn):
        """Refuse to start on a partition layout other than the one the stream's entries are in."""
        for stream in sorted({spec.logical for spec in self.specs}):
            try:
                partitions.ensure_recorded(conn, stream)
            except TRANSIENT_ERRORS:
                return  # checked by the next start; the read loops report the outage

    def _connect(self, reader_name=None):
        """The shared client (or a dedicated reader), waiting for Redis when it is down at start.

        Whether REDIS_URL is one server or a cluster is asked of Redis when the first client is
        made (shoal_common.redisconn), so that needs Redis to answer; nothing is in flight yet.
        """
        failures = 0
        while True:
            try:
                return reader_connection(reader_name, self.config["BLOCK_MS"]) if reader_name else get_connection()
            except TRANSIENT_ERRORS as exc:
                failures += 1
                if failures == 1:
                    started = time.monotonic()
                    logger.warning("Consumer %s: Redis unreachable at start (%s); waiting for it", self.name, exc)
                if self.burst and time.monotonic() - started >= self.burst_redis_wait:
                    raise BurstGaveUp(f"--burst gave up: Redis unreachable for {self.burst_redis_wait:g}s at start "
                                      f"({exc}); nothing was handled") from None
                self._wait_at_start(min(5.0, 0.1 * 2 ** min(failures, 6)))

    def _wait_at_start(self, seconds):
        """Sleep ``seconds``, unless a TERM/INT arrives (its own handlers are not installed yet): then
        stop, with nothing read and nothing in flight."""
        deadline = time.monotonic() + seconds
        while True:
            if early_signals.pending():
                raise StoppedAtStart(early_signals.take()[0])
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.05))

    def renew_liveness(self, now=None):
        """Renew this consumer's deadline on every stream it reads (every third of CONSUMER_TTL)."""
        now = self.clock() if now is None else now
        ttl = self.config["CONSUMER_TTL"]
        if now < self.liveness_due:
            return
        try:
            liveness.beat(get_connection(), self.streams, self.name, ttl * 1000)
            self.liveness_due = now + ttl / 3
        except TRANSIENT_ERRORS:
            recover(get_connection())  # liveness scripts go to nodes directly: follow a failover
            self.liveness_due = now + 1.0  # the read loops report the outage; try again soon
            return
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            # At maxmemory: the read loops go on draining. The deadline may lapse meanwhile; others
            # judge this consumer dead only if its connections are gone too, and they are not.
            refusals.refused("liveness", exc)
            self.liveness_due = now + 1.0
            return
        refusals.accepted()

    def move_scheduled(self):
        """Move the due deferred messages of the streams this worker reads onto them (scheduled.Mover:
        one script call per node, when a stream's time has come). Not once stopping: others move them."""
        if not self.shutdown.is_set():
            self.mover.tick()

    def replace_process(self, reason):
        """Replace this process (shoal_common.replacement): its deadline marked lapsed first, so its pending
        entries are taken over at once (by its replacement too) instead of after PENDING_TIMEOUT_MS."""
        logger.error("Consumer %s: %s; replacing this process (its other in-flight entries are delivered again)",
                     self.name, reason)
        self.liveness_due = float("inf")  # the main loop must not renew what is marked lapsed here
        for loop in self.loops:
            if getattr(loop, "runs", None) is not None:
                loop.runs.release()
        try:
            liveness.beat(get_connection(), self.streams, self.name, 0)
        except (*TRANSIENT_ERRORS, redis.ResponseError):
            pass  # they are taken over after the pending timeout instead
        sys.stdout.flush()
        sys.stderr.flush()
        if self.shutdown.is_set():  # asked to stop: a fresh process would go on consuming
            os._exit(EXIT_FORCED)
        self.replace()

    def forget_liveness(self):
        # A clean exit is not a death: drop the deadline so nobody takes over what stays pending
        # before the pending timeout (its entries are unacked because handlers ran out of time).
        try:
            liveness.forget(get_connection(), self.streams, self.name)
        except (*TRANSIENT_ERRORS, redis.ResponseError):
            pass  # it lapses by itself

    def progress_stamp(self, now):
        """For the supervisor's heartbeat: ``now`` while idle, else when a handler last made progress.

        With both kinds of handler, progress of either counts; a pool with nothing running has
        nothing stuck. Executors without progress tracking (unsupervised workers) count as progress.
        """
        stamps = []
        for pool in (self.executor, self.event_loop):
            progress = getattr(pool, "progress_stamp", None)
            if pool is not None:
                stamp = progress(now) if progress is not None else now
                if stamp != now:
                    stamps.append(stamp)
        return max(stamps) if stamps else now

    @property
    def streams(self):
        return sorted({spec.stream for spec in self.specs})

    @property
    def reader_client_name(self):
        # CLIENT SETNAME forbids spaces; consumer names come from host names, which have none.
        return liveness.reader_client_name(self.name)

    def _run_loop(self, loop):
        logformat.set_context(thread=True, stream=loop.stream, group=loop.group)
        try:
            loop.run()
        except BaseException as exc:
            loop.crashed = exc
            logger.exception("Consumer %s: read loop of %s/%s crashed", self.name, loop.stream, loop.group)

    def alive(self):
        return any(t.is_alive() for t in self.threads_)

    @property
    def burst_redis_wait(self):
        return min(BURST_REDIS_WAIT, self.burst_timeout if self.burst_timeout is not None else BURST_REDIS_WAIT)

    def check_burst(self):
        """End a burst that cannot end by itself (a handler feeding its own stream, Redis gone): exit 4, not 0."""
        if not self.burst or self.shutdown.is_set():
            return
        now = time.monotonic()
        down_since = self.outage.since
        if down_since is not None and now - down_since >= self.burst_redis_wait:
            self.burst_left = (f"--burst gave up: Redis unreachable for {self.burst_redis_wait:g}s; what was not "
                               "acked stays pending")
        elif now >= self.burst_deadline:
            self.burst_left = (f"--burst gave up after --burst-timeout {self.burst_timeout:g}s with work left "
                               "(a handler that keeps publishing to the streams it reads never lets a burst end); "
                               "what was not handled stays in the streams")
        else:
            return
        logger.error("Consumer %s: %s", self.name, self.burst_left)
        self.exit_code = EXIT_BURST_UNFINISHED
        self.stop(graceful=True)

    def check_loops(self):
        for loop in self.loops:
            if getattr(loop, "crashed", None) is not None and not self.shutdown.is_set():
                self.exit_code = EXIT_CRASH
                self.stop(graceful=True)

    # -- signals ----------------------------------------------------------------------------

    def install_signals(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for signum in early_signals.take():  # a TERM that came during start-up
            self.signals.put(signum)

    def _on_signal(self, signum, frame):
        self.signals.put(signum)  # SimpleQueue.put is reentrant: safe in a signal handler

    def handle_signal(self, signum):
        if self.follower.changed is not None:  # stopping to follow a repartition: this is a first TERM/INT
            self.follower.changed = None  # so runconsumer does not start again
            logger.info("Consumer %s: %s received, finishing in-flight work", self.name, signal.Signals(signum).name)
            return
        if self.shutdown.is_set():
            logger.warning("Consumer %s: second %s, exiting now; unacknowledged entries stay pending",
                           self.name, signal.Signals(signum).name)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_FORCED)
        self.stop(graceful=True)
        logger.info("Consumer %s: %s received, finishing in-flight work (up to %ss)",
                    self.name, signal.Signals(signum).name, self.shutdown_timeout)

    def follow_layout(self):
        """A repartition changed which partitions to read: stop cleanly, to start again on the new layout."""
        if self.shutdown.is_set() or self.burst:
            return
        stream = self.follower.tick()
        if stream is not None:
            logger.info("Consumer %s: the partition layout of %s changed; finishing in-flight work to start again "
                        "on it", self.name, stream)
            self.stop(graceful=True)

    def stop(self, graceful=True):
        self.shutdown.deadline = self.clock() + (self.shutdown_timeout if graceful else 0)
        self.shutdown.set()
        self.unblock_readers()

    def unblock_readers(self):
        """Cut short this worker's blocked XREADGROUPs, so nothing is read after the stop."""
        if not self.can_unblock or not any(loop.reading for loop in self.loops):
            return
        try:
            conn = get_connection()
            # Client ids are per node: each reader is blocked on the node that holds its stream.
            nodes = {id(node): node for node in (node_client(conn, stream) for stream in self.streams)}
            for node in nodes.values():
                for client in node.client_list():
                    if client.get("name") == self.reader_client_name and client.get("cmd") in ("xreadgroup", "xread"):
                        node.client_unblock(int(client["id"]))
        except TRANSIENT_ERRORS:
            pass  # the blocked read ends by itself within BLOCK_MS
        except redis.ResponseError as exc:
            if not is_no_permission(exc):
                raise
            self.can_unblock = False  # ACL changed under us: the read ends by itself within BLOCK_MS
            logger.warning("Consumer %s: the Redis user may not run CLIENT LIST/UNBLOCK (%s); the blocked read "
                           "ends by itself within BLOCK_MS", self.name, exc)


class StoppedAtStart(Exception):
    """A TERM/INT arrived while the worker waited for Redis at start: it exits 0 without starting."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum
