"""A worker process of the runconsumer supervisor: ``python -m streams_app.supervisor.worker_main ...``.

The master starts each worker as a fresh interpreter (fork + exec), never as a bare fork of
itself: a fork would run the handler code the master imported at its start, so a HUP could never
load new code, and it would inherit the master's sockets. Here Django is set up, and the handler
modules imported, from scratch. (With ``--preload`` a zygote does that once and forks the workers,
which then run ``consume()``: streams_app.supervisor.zygote.)

Anything that goes wrong before the worker consumes (settings, an ImportError in a consumers.py,
a selector no longer registered, a key of the wrong type) exits with EXIT_BOOT_ERROR: restarting
would not help, and the master halts instead of respawning it forever.
"""
import argparse
import logging
import os
import signal
import sys
import traceback

from setproctitle import setproctitle

from shoal_common.exitcodes import EXIT_CONFIG, EXIT_REPLACED
from streams_app.supervisor.heartbeat import Beater, ProgressExecutor

EXIT_BOOT_ERROR = EXIT_CONFIG  # the master stops instead of respawning a worker that cannot boot

logger = logging.getLogger("streams_app.supervisor")


def parse_args(argv, *, prog="python -m streams_app.supervisor.worker_main", description=__doc__, forked=False):
    """The worker's options; ``forked``: the zygote's (streams_app.supervisor.zygote), whose workers get
    their heartbeat descriptor with each fork request instead of on the command line."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("selectors", nargs="*")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--block-ms", type=int)
    parser.add_argument("--shutdown-timeout", type=float)
    if forked:
        parser.add_argument("--control-fd", type=int, required=True)
    else:
        parser.add_argument("--heartbeat-fd", type=int, required=True)
    parser.add_argument("--heartbeat-interval", type=float, required=True)
    parser.add_argument("--master-pid", type=int, required=True)
    parser.add_argument("--log-level", type=int, default=logging.INFO)
    return parser.parse_args(argv)


def title(state, name, selectors):
    setproctitle(f"shoal: runconsumer worker {state} {name} [{' '.join(selectors) or 'all consumers'}]")


def boot(args):
    """Set up Django and select the consumers; raises whatever stops this worker from ever running."""
    import django

    django.setup()
    logging.getLogger("streams_app").setLevel(args.log_level)
    from streams_app.registry import select

    return select(args.selectors)


def make_worker(args, specs, heartbeat_fd):
    from streams_app.consuming.worker import Worker

    class SupervisedWorker(Worker):
        executor_class = ProgressExecutor

        def replace(self):
            os._exit(EXIT_REPLACED)  # the supervisor starts a fresh worker at once (master.on_exit)

        def stop(self, graceful=True):
            if not self.shutdown.is_set():
                title("stopping", self.name, args.selectors)
            super().stop(graceful)

    def orphaned(worker):
        if not worker.shutdown.is_set():
            logger.warning("Consumer %s: the supervisor (pid %s) is gone; stopping", worker.name, args.master_pid)
            worker.stop(graceful=True)

    beater = Beater(heartbeat_fd, args.heartbeat_interval, master_pid=args.master_pid, on_orphaned=orphaned)
    return SupervisedWorker(specs, threads=args.threads, concurrency=args.concurrency, batch=args.batch, block_ms=args.block_ms,
                            shutdown_timeout=args.shutdown_timeout, heartbeat=beater)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # A process group of its own is a background group for the master's terminal: with `stty tostop`
    # writing the log there would stop the worker.
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    title("booting", f"pid {os.getpid()}", args.selectors)
    try:
        specs = boot(args)
    except Exception as exc:
        traceback.print_exc()
        sys.stderr.write(f"Worker {os.getpid()} failed to boot: {type(exc).__name__}: {exc}\n")
        return EXIT_BOOT_ERROR

    return consume(args, specs, args.heartbeat_fd)


def consume(args, specs, heartbeat_fd):
    """Run the worker until it stops; its exit code. Shared with the workers a zygote forks."""
    from streams_app.exceptions import StreamsError

    worker = make_worker(args, specs, heartbeat_fd)
    title("consuming", worker.name, args.selectors)
    try:
        code = worker.run()
    except StreamsError as exc:
        sys.stderr.write(f"Worker {os.getpid()} failed to boot: {exc}\n")
        return EXIT_BOOT_ERROR
    if worker.stuck:
        # Handler threads that ignored the shutdown timeout would keep the interpreter alive.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
