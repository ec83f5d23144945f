"""Starting worker processes for the supervisor: fork + exec of ``python -m streams_app.supervisor.worker_main``.

A fresh interpreter per worker, rather than a bare fork of the master, so that
- a HUP loads the handler code as it is on disk now (the master imported it at its own start);
- nothing of the master is inherited: Popen closes every descriptor but stdio and the heartbeat
  file, so no Redis or database socket of the master is ever shared with a worker.
(``--preload`` forks them from a zygote instead: streams_app.supervisor.preload.)
Workers get a process group of their own: a Ctrl-C at a terminal reaches only the master, which
then stops them gracefully (otherwise they would see the master's TERM as a second signal).
"""
import os
import subprocess
import sys

from django.db import connections

from streams_app.supervisor.heartbeat import HeartbeatFile


def child_env(environ=None):
    """The master's environment, with the directory it was started from (manage.py's) importable."""
    env = dict(os.environ if environ is None else environ)
    root = os.path.abspath(sys.path[0] or os.getcwd())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


class ExecSpawner:
    def __init__(self, selectors, *, heartbeat_interval, threads=None, batch=None, block_ms=None,
                 shutdown_timeout=None, log_level=None, concurrency=None):
        self.selectors = list(selectors)
        options = {"--threads": threads, "--concurrency": concurrency, "--batch": batch, "--block-ms": block_ms,
                   "--shutdown-timeout": shutdown_timeout, "--log-level": log_level,
                   "--heartbeat-interval": heartbeat_interval}
        self.options = [item for key, value in options.items() if value is not None for item in (key, str(value))]
        self.env = child_env()

    def argv(self, heartbeat_fd):
        return [sys.executable, "-m", "streams_app.supervisor.worker_main", *self.selectors, *self.options,
                "--heartbeat-fd", str(heartbeat_fd), "--master-pid", str(os.getpid())]

    def __call__(self, number):
        # Django's own advice before fork(): a child must never share the parent's database socket.
        connections.close_all()
        heartbeat = HeartbeatFile()
        try:
            proc = subprocess.Popen(self.argv(heartbeat.fd), env=self.env, pass_fds=(heartbeat.fd,),
                                    stdin=subprocess.DEVNULL, process_group=0, cwd=os.getcwd())
        except BaseException:
            heartbeat.close()
            raise
        return proc, heartbeat
