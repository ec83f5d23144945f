"""The gunicorn master's side of discovery registration: which address to advertise, and a supervisor
that keeps ``python -m discovery_app.web_registration`` running and stops it first on shutdown.

Imported by streams_app.web.gunicorn_conf, so: no Django, no app code (the master's imports are inherited,
unreloaded, by the workers it forks after a HUP).

Lifecycle of the web tier's instance:
- registered once the master listens (``when_ready``), by the registration process;
- deregistered the moment the master gets TERM, INT or QUIT, before gunicorn closes its sockets
  and drains: the master's ``stop()`` calls ``begin_stop()``, which TERMs the registration process,
  whose Registrar deregisters at once;
- if the registration process dies meanwhile (killed, OOM), the supervisor logs a WARNING,
  starts a new one (same instance id, so no duplicate record) after a back-off, and /readyz
  shows the restarts; if the master itself dies (SIGKILL), the pipe to the registration process
  closes and it deregisters; if both die, the record expires after the TTL.
"""
import ipaddress
import json
import os
import socket
import subprocess
import tempfile
import time

STATUS_ENV = "SHOAL_WEB_REGISTRATION_STATUS"
"""Environment variable naming the JSON file where the supervisor writes the registration
process's state, for /readyz (workers inherit the variable from the master)."""

# Where a UDP socket is "connected" to learn which local address the default route uses: nothing
# is sent. Documentation ranges (RFC 5737 / RFC 3849), so no real host is ever named.
ROUTE_PROBES = ((socket.AF_INET, "198.51.100.1"), (socket.AF_INET6, "2001:db8::1"))


def default_route_address():
    """The local address of the interface the default route goes out of, or None."""
    for family, target in ROUTE_PROBES:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((target, 9))
                return probe.getsockname()[0]
        except OSError:
            continue
    return None


def is_loopback(address):
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def advertised_address(bound_host, environ=os.environ, route_address=default_route_address):
    """(address to register or None, why): the bound address; when bound to every interface,
    WEB_ADVERTISE_ADDRESS, else the default route's interface. A loopback address is refused for a
    non-loopback bind: other machines could not reach it (``gethostbyname(hostname)`` is 127.0.1.1
    on Debian-style hosts)."""
    if bound_host not in ("0.0.0.0", "::", ""):
        return bound_host, f"the bound address {bound_host}"
    configured = environ.get("WEB_ADVERTISE_ADDRESS")
    if configured:
        return configured, "WEB_ADVERTISE_ADDRESS"
    found = route_address()
    if found is None or is_loopback(found):
        return None, (f"bound to {bound_host or 'every interface'} but found no routable address "
                      f"(the default route gives {found}); set WEB_ADVERTISE_ADDRESS")
    return found, "the interface of the default route (set WEB_ADVERTISE_ADDRESS to choose)"


class RegistrationSupervisor:
    """Keeps the registration process running, from the master's own loop: no thread of its own.

    A thread here made gunicorn's master multi-threaded when it forked its workers, and Python 3.12+
    warns that ``fork()`` may then deadlock the child (a lock held by the other thread stays held in
    the copy). gunicorn's master wakes at least once a second; ``tick()`` runs on each pass (from
    ``ShoalArbiter.manage_workers``), ``begin_stop()`` from its ``stop()``, before the drain."""

    def __init__(self, argv, cwd, log, status_path=None, backoff=(1.0, 30.0), clock=time.monotonic):
        self.argv = argv
        self.cwd = cwd
        self.log = log
        self.status_path = status_path
        self.backoff_min, self.backoff_max = backoff
        self.clock = clock
        self.process = None
        self._spawned_at = 0.0
        self.restarts = 0
        self.stopping = False
        self.delay = self.backoff_min
        self.restart_at = None  # set while a dead registration process waits for its restart

    def start(self):
        self._spawn()
        return self

    def tick(self, now=None):
        """One pass: notice a dead registration process, restart it once its back-off is over."""
        if self.stopping or self.process is None:
            return
        now = self.clock() if now is None else now
        if self.restart_at is None:
            if self.process.poll() is None:
                return
            self.handle_death(now)
        if now >= self.restart_at:
            self.handle_restart()

    def begin_stop(self):
        """The master is stopping (TERM, INT, QUIT, a halt): deregister now, before gunicorn drains."""
        if self.stopping:
            return
        self.stopping = True
        if self.process is not None and self.process.poll() is None:
            self.log.info("Discovery registration: deregistering before the drain (pid %s).", self.process.pid)
            self.process.terminate()
        self._write_status("stopping")

    def stop(self, timeout=10.0):
        """At the master's exit: EOF to the registration process (it deregisters), wait, kill."""
        self.stopping = True
        process = self.process
        if process is None:
            return
        try:
            process.stdin.close()
        except OSError:
            pass
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()  # reaped: no zombie, no ResourceWarning at the master's exit
        self._write_status("stopped")

    def close_in_child(self):
        """In a forked worker: drop the inherited pipe, or the registration process would not see
        the master die, and the worker's copy of the Popen, which is not its child: at the worker's exit
        its ``__del__`` warned ``ResourceWarning: subprocess N is still running`` (each worker, each exit)."""
        process = self.process
        if process is None:
            return
        if not process.stdin.closed:
            process.stdin.close()
        # waitpid() in this process: ECHILD (the master's child, not ours), and Popen then counts it as done
        # (returncode 0) in this copy only; nothing is reaped, the master's copy is untouched.
        process.poll()

    def handle_death(self, now):
        if now - self._spawned_at > self.backoff_max:
            self.delay = self.backoff_min  # it had been up a while: not a crash loop
        self.log.warning("Discovery registration process (pid %s) is gone; this web instance is not "
                         "discoverable. Restarting it in %.0f s.", self.process.pid, self.delay)
        self._write_status("restarting")
        self.restart_at = now + self.delay

    def handle_restart(self):
        self.restart_at = None
        self.restarts += 1
        self._spawn()
        self.log.warning("Discovery registration restarted (pid %s, restart %s).", self.process.pid, self.restarts)
        self.delay = min(self.backoff_max, self.delay * 2)

    def _spawn(self):
        previous = self.process
        if previous is not None and previous.stdin is not None:
            previous.stdin.close()  # the dead one's pipe: left to the collector it is a ResourceWarning
        self.process = subprocess.Popen(self.argv, cwd=self.cwd, stdin=subprocess.PIPE)
        self._spawned_at = self.clock()
        self._write_status("running")

    def _write_status(self, state):
        """Never raises: it runs in the master's exit hook too, where an exception turned a halt's exit
        code 3 into 1. Each write goes to a temp file of its own (the registration process writes this
        file too): one name per pid had one writer's rename take the other's file away."""
        if not self.status_path:
            return
        status = {"state": state, "pid": self.process.pid if self.process else None,
                  "restarts": self.restarts, "since": time.time()}
        tmp = None
        try:
            directory, name = os.path.split(self.status_path)
            fd, tmp = tempfile.mkstemp(prefix=f"{name}.", suffix=".tmp", dir=directory or ".")
            with os.fdopen(fd, "w") as f:
                json.dump(status, f)
            os.replace(tmp, self.status_path)  # readers never see half a file
        except OSError as exc:
            self.log.warning("Discovery registration: could not write its state to %s (%s); /readyz shows an "
                             "older one", self.status_path, exc)
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
