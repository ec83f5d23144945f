"""``Registrar``: keeps one instance registered for the life of a process.

``start()`` registers and heartbeats from a daemon thread; ``stop()`` (also run at interpreter
exit) deregisters. Every Redis connection is made inside that thread, so a gunicorn master can
run a Registrar without handing sockets to the workers it forks, and exit hooks inherited by
those workers do nothing (only the process that started it deregisters). Redis outages are
retried with capped back-off; the first heartbeat after one re-registers the instance if its
record has gone. While backing off from a connection failure the thread PINGs about once a second,
so that heartbeat comes as soon as Redis answers again, not at the end of a back-off that has grown
to HEARTBEAT_INTERVAL (clients meanwhile serve the instance from their self-preservation).

On SIGTERM (and SIGINT) the instance is deregistered at once, before the application's own drain:
callers stop picking an instance that is about to stop. The handler only records the signal and
wakes the thread, then chains to the handler that was there before (the application's, gunicorn's,
Django's); when there was none, the thread deregisters and then lets the default action kill the
process, as if nothing had been installed. A signal the application ignores is left alone. A health
check in flight does not hold it up: the check runs in a thread of its own, abandoned when a signal
or ``stop()`` comes first.
"""
import atexit
import logging
import math
import os
import random
import select
import signal
import threading
import time

from discovery_app.conf import get_settings
from discovery_app.connection import TRANSIENT_ERRORS, recover
from discovery_app.exceptions import InvalidRegistration
from discovery_app.registry import ServiceRegistry, build_instance
from discovery_app.short_timeout import dedicated_registry_connection
from shoal_common.backoff import backoff_delay

logger = logging.getLogger("discovery_app.registrar")

PROBE_SECONDS = 1.0
"""How often a registrar backing off from an unreachable Redis asks whether it answers again (a PING)."""


class Registrar:
    def __init__(self, service, address, port, metadata=None, interval=None, registry=None,
                 instance_id=None, ttl=None, health_check=None, health_failures=3):
        """``health_check``: None, a callable (truthy: passing; an exception: failing) or an http(s) URL
        (2xx: passing), run before each heartbeat; after ``health_failures`` failures in a row the
        instance is marked failing (clients skip it while others remain), and it is marked passing
        again at the first success. The heartbeat itself goes on either way."""
        config = get_settings()
        # Validates now, in the caller, so a bad registration fails loudly instead of in a thread.
        self.instance = build_instance(service, address, port, metadata, instance_id)
        self.metadata = metadata
        self.interval = float(config["HEARTBEAT_INTERVAL"] if interval is None else interval)
        self.ttl = ttl
        effective_ttl = float(config["TTL"] if ttl is None else ttl)
        if not math.isfinite(effective_ttl):
            raise InvalidRegistration(f"the TTL ({effective_ttl:g} s) must be a finite number of seconds")
        if not 0 < self.interval < effective_ttl:
            raise InvalidRegistration(f"the heartbeat interval ({self.interval:g} s) must be positive and below the "
                                      f"TTL ({effective_ttl:g} s), or the instance expires between heartbeats")
        self.backoff_max = config["RETRY_BACKOFF_MAX"]
        self.registry = registry
        self._made_registry = False  # True once the thread made its own (closed at stop)
        if isinstance(health_check, str) and not health_check.startswith(("http://", "https://")):
            raise InvalidRegistration(f"health_check must be a callable or an http(s) URL, not {health_check!r}")
        self.health_check = health_check
        self.health_failures = int(health_failures)
        self._failures = 0
        self.failing = False
        self.registered = threading.Event()
        self.deregistered_by_operator = False
        self._first_attempt = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        self._pid = None
        self._wake_r = self._wake_w = None  # the signal handler's only way to reach the thread
        self._signalled = None  # the signal number, set by the handler
        self._previous_handlers = {}
        self._deregistered = False
        self._prober = None  # the health check's thread, when one runs

    @property
    def instance_id(self):
        return self.instance.instance_id

    def start(self, wait=5.0, signals=(signal.SIGTERM, signal.SIGINT)):
        """Start the heartbeat thread; wait up to ``wait`` s for the first registration attempt.

        ``signals``: deregister as soon as one arrives (chained to the previous handlers; only
        possible from the main thread, skipped elsewhere). ``()`` to leave signals alone.
        """
        if self._thread is not None and self._pid == os.getpid():
            return self  # already running
        self._pid = os.getpid()
        self._stop.clear()
        self._first_attempt.clear()
        self.deregistered_by_operator = False
        self._signalled, self._deregistered = None, False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self.run, name=f"discovery-registrar-{self.instance.service}",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.stop)
        self._install_signal_handlers(signals)
        if wait:
            self._first_attempt.wait(wait)
        return self

    def stop(self, timeout=5.0):
        """Stop heartbeating and deregister. Does nothing in a forked child of the starter."""
        if self._pid != os.getpid() or self._thread is None:
            return
        atexit.unregister(self.stop)
        self._restore_signal_handlers()
        self._stop.set()
        self._wake()
        thread, self._thread = self._thread, None
        thread.join(timeout)
        if not self._deregistered:
            self._deregister()
        prober = self._prober
        if not thread.is_alive() and (prober is None or not prober.is_alive()):
            # A thread stuck on a hung Redis still selects on the pipe, and a probe left to finish alone
            # writes to it: closed, its number could be another file's by then.
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            self._wake_r = self._wake_w = None
            if self._made_registry:  # its pool is the thread's own: closed, not left to the interpreter's exit
                registry, self.registry = self.registry, None
                pool = getattr(registry.connection, "connection_pool", None)  # close() leaves a pool given to it
                try:
                    pool.disconnect() if pool is not None else registry.connection.close()
                except Exception:  # noqa: BLE001 -- stopping: nothing to do about it
                    pass

    # -- signals ---------------------------------------------------------------------------

    def _install_signal_handlers(self, signals):
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in signals:
            previous = signal.getsignal(signum)
            if previous in (signal.SIG_IGN, None):  # ignored on purpose, or not Python's to chain
                continue
            self._previous_handlers[signum] = previous
            signal.signal(signum, self._handle_signal)

    def _restore_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous_handlers.items():
            if signal.getsignal(signum) == self._handle_signal:
                signal.signal(signum, previous)
        self._previous_handlers = {}

    def _handle_signal(self, signum, frame):
        # Record, wake the thread, chain. No logging, no Redis: this runs between two bytecodes of
        # whatever the main thread was doing.
        previous = self._previous_handlers.get(signum, signal.SIG_DFL)
        if os.getpid() != self._pid:
            # A forked child inherited this handler but not the Registrar's thread (nor its record):
            # act as if it had never been installed, or the child would ignore TERM for good.
            if previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            elif callable(previous):
                previous(signum, frame)
            return
        if self._signalled is None:
            self._signalled = signum
            self._wake()
        if previous == signal.SIG_DFL:
            # Nobody else handles it: the thread deregisters, then re-sends it to die of it.
            signal.signal(signum, signal.SIG_DFL)
        elif callable(previous):
            previous(signum, frame)

    def _wake(self):
        try:
            os.write(self._wake_w, b"!")
        except (OSError, TypeError):  # full (already woken) or closed by stop()
            pass

    def _sleep(self, seconds):
        if self._signalled is not None or self._stop.is_set():
            return  # its wake-up may have been read already (by _probe_unless_stopping); the flag is set before
        readable, _, _ = select.select([self._wake_r], [], [], seconds)
        if readable:
            os.read(self._wake_r, 64)

    def _on_signal(self):
        signum = self._signalled
        logger.info("Discovery: %s: got %s; deregistering now, before the process drains",
                    self.instance_id, signal.Signals(signum).name)
        self._deregister()
        if self._previous_handlers.get(signum) == signal.SIG_DFL:
            os.kill(os.getpid(), signum)  # the default action, now that callers have been told

    def _deregister(self):
        self._deregistered = True
        self.registered.clear()
        try:
            self._registry().deregister(self.instance_id, service=self.instance.service)
        except TRANSIENT_ERRORS as exc:
            logger.warning("Discovery: could not deregister %s (%s); it expires after its TTL",
                           self.instance_id, exc)

    def run(self):
        failures = 0
        registered = False
        while not self._stop.is_set():
            if self._signalled is not None:
                self._on_signal()
                return
            try:
                # Inside the retry: making the client asks Redis whether it is a cluster.
                registry = self._registry()
                if not registered:
                    registry.register(self.instance.service, self.instance.address, self.instance.port,
                                      self.metadata, instance_id=self.instance_id)
                    registered = True
                    self.registered.set()
                    self._failures, self.failing = 0, False
                else:
                    outcome = registry.heartbeat(self.instance_id)
                    if outcome == "deregistered":
                        self.deregistered_by_operator = True
                        self.registered.clear()
                        logger.warning("Discovery: %s was deregistered by someone else; heartbeats stop",
                                       self.instance_id)
                        return
                    if outcome == "reregistered":
                        self._failures, self.failing = 0, False  # the health mark went with the record
                    if outcome == "conflict":
                        # Another live process holds this id's record (the registry says so once): not
                        # listed meanwhile, and its health is the other's to mark.
                        self.registered.clear()
                    else:
                        self.registered.set()
                if self.health_check is not None and self.registered.is_set():
                    self._check_health(registry)
                if failures:
                    logger.info("Discovery: the registry is reachable again; %s is registered", self.instance_id)
                failures = 0
                wait = self.interval
            except Exception as exc:
                # Transient (connection lost) or not (OOM, READONLY during a failover, a bug): a
                # heartbeat thread that dies leaves a live instance unlisted for good, so it backs
                # off and tries again, re-registering in full when it gets through.
                if self.registry is not None:
                    recover(self.registry.connection)  # its scripts go to nodes directly: follow a failover
                failures += 1
                backoff = backoff_delay(failures, first=0.2, cap=min(self.backoff_max, self.interval))
                registered = registered and isinstance(exc, TRANSIENT_ERRORS)
                logger.warning("Discovery: cannot reach the registry for %s (%s: %s); retrying in %.1f s",
                               self.instance_id, type(exc).__name__, exc, backoff,
                               exc_info=not isinstance(exc, TRANSIENT_ERRORS))
                wait = backoff
                if isinstance(exc, TRANSIENT_ERRORS):
                    self._first_attempt.set()
                    self._back_off(backoff)
                    continue
            finally:
                self._first_attempt.set()
            self._sleep(wait)

    def _back_off(self, seconds):
        """Wait ``seconds``, or less: until a PING gets an answer (Redis is back), a signal, or stop().

        Only after a connection failure: a Redis that answers and refuses (OOM, READONLY) would
        answer the PING too, and the full back-off is what spares it then.
        """
        deadline = time.monotonic() + seconds
        while self._signalled is None and not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            # Jittered, so that the instances that lost Redis together do not all come back in one beat.
            self._sleep(min(remaining, PROBE_SECONDS * (0.5 + 0.5 * random.random())))
            if self._signalled is not None or self._stop.is_set() or time.monotonic() >= deadline:
                return
            try:
                self._registry().connection.ping()
            except Exception:  # noqa: BLE001 - still unreachable (or not yet a client): keep waiting
                continue
            return

    def _check_health(self, registry):
        passing = self._probe_unless_stopping()
        if passing is None:
            return  # a signal or stop() came first: deregistration does not wait for the probe
        self._failures = 0 if passing else self._failures + 1
        if not passing and not self.failing and self._failures >= self.health_failures:
            registry.set_health(self.instance.service, self.instance_id, failing=True)
            self.failing = True
            logger.warning("Discovery: %s failed its health check %d times; clients skip it until it passes",
                           self.instance_id, self._failures)
        elif passing and self.failing:
            registry.set_health(self.instance.service, self.instance_id, failing=False)
            self.failing = False
            logger.info("Discovery: %s passes its health check again", self.instance_id)

    def _probe_unless_stopping(self):
        """The health check's outcome, or None if a signal or stop() comes first.

        The check runs in a thread of its own, which is left to finish alone then: a probe of an HTTP
        endpoint waits behind the very requests that make an instance busy, up to its timeout, and
        deregistration on TERM must not wait behind it (callers would keep picking an instance that
        already refuses connections)."""
        outcome = []

        def check():
            outcome.append(self._probe())
            self._wake()

        self._prober = prober = threading.Thread(target=check, name=f"discovery-health-{self.instance.service}",
                                                 daemon=True)
        prober.start()
        while not outcome:
            if self._signalled is not None or self._stop.is_set():
                return None
            self._sleep(None)  # woken by the probe, a signal or stop()
        prober.join()  # its wake-up is written: read it now, or the next heartbeat would come early
        self._sleep(0)
        return outcome[0]

    def _probe(self):
        try:
            if callable(self.health_check):
                return bool(self.health_check())
            import urllib.request

            timeout = max(0.5, min(5.0, self.interval / 2))
            with urllib.request.urlopen(self.health_check, timeout=timeout) as response:
                return 200 <= response.status < 300
        except Exception as exc:  # noqa: BLE001 - any error is a failed check
            logger.debug("Discovery: health check of %s failed: %s", self.instance_id, exc)
            return False

    def _registry(self):
        if self.registry is None:
            # Made lazily in whichever thread needs it; never in the process that forks workers' sockets.
            self.registry = ServiceRegistry(dedicated_registry_connection(), ttl=self.ttl)
            self._made_registry = True
        return self.registry
