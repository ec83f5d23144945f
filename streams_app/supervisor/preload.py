"""``runconsumer --preload``: workers forked from a zygote (streams_app.supervisor.zygote), not exec'd.

The master starts the zygote (a fresh interpreter) at the first worker it needs and asks it for a
fork per worker; each fork shares, copy-on-write, what the zygote imported. The workers become the
master's own children (it is a child subreaper), so the supervisor waits for them and signals them
as it does exec'd ones: crash limits, replacements, TERM and the rolling restart are unchanged.

HUP loads new code: ``reload()`` marks the zygote stale, and the rolling restart's first new worker
starts a new zygote, which imports the code on disk then. If it cannot boot (an ImportError in a
consumers.py), it stands in for that worker as one that failed to boot: the supervisor aborts the
rollout, and the old zygote stays, so replacements keep running the previous code until the next HUP.
A zygote that dies is started again at the next worker needed (it then loads the code on disk, as an
exec'd replacement would).
"""
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time

from django.db import connections

from streams_app.exceptions import ConsumerConfigError
from streams_app.metrics import multiprocess
from streams_app.supervisor.heartbeat import HeartbeatFile
from streams_app.supervisor.spawn import ExecSpawner
from streams_app.supervisor.worker_main import EXIT_BOOT_ERROR

logger = logging.getLogger("streams_app.supervisor")

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
REPLY_TIMEOUT = 5.0  # seconds a fork request may take (it takes milliseconds) before the zygote counts as hung
RETIRE_TIMEOUT = 5.0
BOOT_POLL = 0.1  # how often a master waiting for its zygote looks for a stop signal


def become_subreaper():
    """Orphaned descendants (the workers, once their middle process exits) become our children."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise ConsumerConfigError(f"--preload needs prctl(PR_SET_CHILD_SUBREAPER), which failed here: "
                                  f"{os.strerror(ctypes.get_errno())}; run without --preload")


class ForkedProcess:
    """The part of ``Popen`` the supervisor uses, for a worker that is our child without our fork."""

    def __init__(self, pid):
        self.pid = pid
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # never became our child: nothing to wait for, and it is not ours
                logger.error("Supervisor: worker pid %s is not this master's child", self.pid)
                self.returncode = 1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:  # never signal a pid we have reaped: it may be someone else's now
            os.kill(self.pid, sig)


class Zygote:
    def __init__(self, proc, control):
        self.proc = proc
        self.pid = proc.pid
        self.control = control

    def close(self):
        if self.control is not None:
            self.control.close()  # end of file: it exits
            self.control = None


class ZygoteSpawner(ExecSpawner):
    """``spawner(number) -> (proc, heartbeat)`` as ExecSpawner, forking from a preloaded zygote."""

    subreaper = True

    def __init__(self, selectors, *, boot_timeout, **options):
        super().__init__(selectors, **options)
        self.boot_timeout = boot_timeout
        self.zygote = None
        self.stale = False
        self.retired = []  # zygotes told to exit, not yet reaped
        # Set by the supervisor: true once a TERM/INT waits, so that a zygote stuck importing does not
        # hold up a stop for as long as it may take to boot.
        self.interrupted = lambda: False
        become_subreaper()

    def argv(self, control_fd):
        return [sys.executable, "-m", "streams_app.supervisor.zygote", *self.selectors, *self.options,
                "--control-fd", str(control_fd), "--master-pid", str(os.getpid())]

    # -- supervisor hooks -------------------------------------------------------------------

    def reload(self):
        self.stale = True
        logger.info("Supervisor: --preload: the next worker forks from a new zygote, which loads the code on disk now")

    def owns(self, pid):
        """Zygotes are our children too; their exit statuses are ours to collect, not the orphans'."""
        return any(z.pid == pid for z in (self.zygote, *self.retired) if z is not None)

    def reap(self):
        for zygote in list(self.retired):
            if zygote.proc.poll() is not None:
                self.retired.remove(zygote)
                self._forget(zygote)
        if self.zygote is not None and self.zygote.proc.poll() is not None:
            logger.warning("Supervisor: zygote (pid %s) exited (%s); the next worker starts a new one",
                           self.zygote.pid, self.zygote.proc.returncode)
            self.zygote.close()
            self._forget(self.zygote)
            self.zygote = None

    def close(self):
        for zygote in (self.zygote, *self.retired):
            if zygote is not None:
                self._retire(zygote, wait=True)
        self.zygote, self.retired = None, []

    # -- spawning ---------------------------------------------------------------------------

    def __call__(self, number):
        heartbeat = HeartbeatFile()
        try:
            if self.zygote is None or self.stale:
                failed = self._replace_zygote()
                if failed is not None:
                    return failed, heartbeat  # stands in for a worker that failed to boot
            return ForkedProcess(self._fork(number, heartbeat.fd)), heartbeat
        except BaseException:
            heartbeat.close()
            raise

    def _replace_zygote(self):
        """Start a zygote and wait until it is ready; on a boot failure, its Popen (exited)."""
        self.stale = False
        connections.close_all()  # as before any fork: no database socket of ours reaches the child
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(self.argv(theirs.fileno()), env=self.env, pass_fds=(theirs.fileno(),),
                                    stdin=subprocess.DEVNULL, process_group=0, cwd=os.getcwd())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        zygote = Zygote(proc, ours)
        logger.info("Supervisor: zygote (pid %s) loading the consumers", zygote.pid)
        reply = self._wait_ready(zygote)
        if reply != b"ready":
            zygote.close()
            proc.wait()
            # Only a boot error (an ImportError in a consumers.py) keeps the previous zygote for the
            # replacements, as an aborted rollout keeps the old workers. A zygote killed or timed out
            # proves nothing about the code: the next worker tries a new zygote again, so that a
            # rollout does not complete on forks of the old code.
            if proc.returncode != EXIT_BOOT_ERROR:
                self.stale = True
            logger.error("Supervisor: zygote (pid %s) failed to boot (exit %s); the worker it was to fork counts as "
                         "one that failed to boot", zygote.pid, proc.returncode)
            return proc  # the supervisor sees a worker that failed to boot (or was killed)
        if self.zygote is not None:
            self._retire(self.zygote)
        self.zygote = zygote
        logger.info("Supervisor: zygote (pid %s) ready", zygote.pid)
        return None

    def _wait_ready(self, zygote):
        """``ready``, or b"" if it exited; None (it is killed) after the boot timeout or on a stop."""
        deadline = time.monotonic() + self.boot_timeout
        zygote.control.settimeout(BOOT_POLL)
        while True:
            try:
                return zygote.control.recv(64)
            except TimeoutError:
                pass
            if self.interrupted():
                logger.warning("Supervisor: stopping while zygote (pid %s) boots; killing it", zygote.pid)
            elif time.monotonic() > deadline:
                logger.error("Supervisor: zygote (pid %s) not ready after %.0fs; killing it", zygote.pid, self.boot_timeout)
            else:
                continue
            zygote.proc.kill()
            return None

    def _fork(self, number, heartbeat_fd):
        zygote = self.zygote
        try:
            zygote.control.settimeout(REPLY_TIMEOUT)
            socket.send_fds(zygote.control, [b"fork %d" % number], [heartbeat_fd])
            reply = zygote.control.recv(256)
        except OSError as exc:
            reply = f"error {exc}".encode()
        if reply.startswith(b"pid "):
            return int(reply[4:])
        # A zygote that cannot fork or answer is not trusted with the next worker either; one that does not
        # answer may be stopped (SIGSTOP) and would never read the end of file that retires it.
        if zygote.proc.poll() is None:
            zygote.proc.kill()
        self._retire(zygote)
        self.zygote = None
        raise OSError(f"zygote (pid {zygote.pid}) did not fork worker {number}: "
                      f"{reply.decode(errors='replace') or 'it exited'}")

    def _retire(self, zygote, wait=False):
        if zygote.control is not None:
            logger.info("Supervisor: zygote (pid %s) retired", zygote.pid)
        zygote.close()
        if wait:
            try:
                zygote.proc.wait(RETIRE_TIMEOUT)
            except subprocess.TimeoutExpired:
                zygote.proc.send_signal(signal.SIGKILL)
                zygote.proc.wait()
            self._forget(zygote)
        elif zygote not in self.retired:
            self.retired.append(zygote)

    def _forget(self, zygote):
        path = self.env.get(multiprocess.ENV)
        if path:
            multiprocess.process_dead(zygote.pid, path)
