"""The zygote of ``runconsumer --preload``: ``python -m streams_app.supervisor.zygote ...``.

The master starts it as a fresh interpreter (fork + exec, like a worker). It sets Django up, imports
the consumer modules and everything a worker runs, calls ``gc.freeze()``, and then only forks
workers when the master asks: they start with those pages shared copy-on-write instead of importing
it all again. The master itself stays as it is (it opens Redis connections and serves metrics from
a thread, so it must never fork a worker); a HUP starts a new zygote, which imports the code on disk
then, and the rolling restart forks the new workers from it.

Forking is only safe from a process that has no other thread (a lock another thread held stays held
in the child) and no open connection (the child would share the socket): the zygote starts no
thread, closes what Django opened while booting, and refuses to serve (exit EXIT_BOOT_ERROR) if a
consumers.py left a thread or a socket behind.

Every worker is forked twice (zygote -> short-lived middle process -> worker), so that when the
middle one exits the worker is re-parented to the master, a child subreaper (PR_SET_CHILD_SUBREAPER):
the master waits for its workers' exit statuses and signals them exactly as with fork + exec.

Protocol, on a SOCK_SEQPACKET socket pair (``--control-fd``): the zygote sends ``ready`` once booted
(or exits with EXIT_BOOT_ERROR); each ``fork N`` from the master carries the worker's heartbeat
descriptor (SCM_RIGHTS) and is answered ``pid P`` (or ``error ...``). End of file: the zygote exits.
"""
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback

from setproctitle import setproctitle

from shoal_common.exitcodes import EXIT_CRASH
from streams_app.supervisor import worker_main
from streams_app.supervisor.worker_main import EXIT_BOOT_ERROR

logger = logging.getLogger("streams_app.supervisor")

REPARENT_TIMEOUT = 30.0
"""Seconds a new worker waits to become the master's child (its middle parent is exiting)."""


def preload(args):
    """Boot as a worker would, then import what a worker runs, so that forks share it all."""
    from streams_app.partitioning import layout

    # Nothing may connect to Redis before the fork: the specs use the declared layout here, and each
    # forked worker makes its own from the live one (consuming/follow.py respecify).
    with layout.offline():
        specs = worker_main.boot(args)
    # Imported here rather than at the workers' first use: every module loaded now is shared.
    import streams_app.consuming.worker  # noqa: F401
    import streams_app.supervisor.heartbeat  # noqa: F401
    from django.db import connections

    connections.close_all()  # a connection a consumers.py opened at import must not be shared
    return specs


def unsafe_state(control_fd):
    """Why this process must not fork, or None: another thread, or a socket besides the master's."""
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if others:
        return f"threads started while importing the consumers: {', '.join(others)}"
    sockets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used
        if target.startswith("socket:") and int(fd) != control_fd:
            sockets.append(f"fd {fd}")
    if sockets:
        return f"connections left open while importing the consumers ({', '.join(sockets)})"
    return None


def serve(control, args, specs):
    setproctitle(f"shoal: runconsumer zygote [{' '.join(args.selectors) or 'all consumers'}]")
    # The master's end of the socket closing (a stop, a HUP's new zygote, the master's death) is our
    # only stop signal; a Ctrl-C at a terminal is the master's to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    control.sendall(b"ready")
    while True:
        message, fds, _flags, _addr = socket.recv_fds(control, 64, 1)
        if not message:
            return 0
        try:
            command, number = message.decode().split()
            if command != "fork" or len(fds) != 1:
                raise ValueError(message)
            reply = b"pid %d" % fork_worker(control, args, specs, int(number), fds[0])
        except Exception as exc:  # a bad request or fork() refused (EAGAIN, ENOMEM): the master logs it
            reply = f"error {type(exc).__name__}: {exc}".encode()
        finally:
            for fd in fds:
                os.close(fd)  # the worker has its own copy
        control.sendall(reply)


def fork_worker(control, args, specs, number, heartbeat_fd):
    """Fork a worker through a middle process; its pid once it is the master's child."""
    sys.stdout.flush()  # else the worker would write what is still buffered a second time
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        code = EXIT_CRASH
        try:
            os.close(read_end)
            worker = os.fork()
            if worker == 0:
                os.close(write_end)
                run_worker(control, args, specs, heartbeat_fd)  # never returns
            os.write(write_end, str(worker).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        pid = pipe.read()
    os.waitpid(middle, 0)  # once it is reaped, the worker's parent is the master
    if not pid:
        raise OSError(f"could not fork worker {number}")
    return int(pid)


def run_worker(control, args, specs, heartbeat_fd):
    """The forked worker: drop what is the zygote's, then run exactly as an exec'd worker does."""
    code = EXIT_CRASH
    try:
        control.close()
        # As an exec'd worker: a process group of its own (a Ctrl-C reaches only the master), a new
        # interpreter's handling of stop signals until the Worker installs its own.
        os.setpgid(0, 0)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # what a new interpreter starts with
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        worker_main.title("booting", f"pid {os.getpid()}", args.selectors)
        # Until the middle process has exited our parent is not the master yet, and the heartbeat
        # would take the master for dead.
        deadline = time.monotonic() + REPARENT_TIMEOUT
        while os.getppid() != args.master_pid:
            if time.monotonic() > deadline:
                sys.stderr.write(f"Worker {os.getpid()}: not adopted by the supervisor (pid {args.master_pid}); exiting\n")
                return
            time.sleep(0.001)
        code = worker_main.consume(args, specs, heartbeat_fd)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else EXIT_CRASH
    except BaseException:
        traceback.print_exc()
    finally:
        # Never return into the zygote's loop: this process is a worker, and exits here.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(argv=None):
    args = worker_main.parse_args(sys.argv[1:] if argv is None else argv, forked=True,
                                  prog="python -m streams_app.supervisor.zygote", description=__doc__)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    control = socket.socket(fileno=args.control_fd)
    setproctitle(f"shoal: runconsumer zygote booting [{' '.join(args.selectors) or 'all consumers'}]")
    try:
        specs = preload(args)
        problem = unsafe_state(args.control_fd)
        if problem:
            raise RuntimeError(f"cannot fork workers safely (--preload): {problem}; run without --preload")
    except Exception as exc:
        traceback.print_exc()
        sys.stderr.write(f"Zygote {os.getpid()} failed to boot: {type(exc).__name__}: {exc}\n")
        return EXIT_BOOT_ERROR
    # Objects that exist now are never collected, so collections in the workers do not write to
    # (and un-share) the pages they sit on.
    gc.freeze()
    return serve(control, args, specs)


if __name__ == "__main__":
    sys.exit(main())
