"""A real gunicorn master (our gunicorn.conf.py) on a free port, for the serving tests and bench/http_bench.py."""
import http.client
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from shoal_common.cpus import available_cpus
from tests.processes import children, cmdline
from tests.redis_server import free_port
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent.parent


def children_of(pid):
    """The gunicorn workers of master ``pid`` (its children, less the discovery registration process)."""
    return [child for child in children(pid) if "web_registration" not in cmdline(child)]


def get(port, path, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


class Gunicorn:
    def __init__(self, directory, redis_url, *, workers=2, args=(), env=None, app="project.wsgi"):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        # With PORT in env, gunicorn binds 0.0.0.0:$PORT by itself, as the README says; else 127.0.0.1.
        self.port = int((env or {}).get("PORT") or free_port())
        self.workers = workers or available_cpus()
        # gunicorn.conf.py's default, under SHOAL_VAR_DIR: the tests set no PROMETHEUS_MULTIPROC_DIR, as
        # a user does not (the variable preset hid that the config set it too late).
        self.metrics_dir = self.directory / "var" / "prometheus"
        self.pidfile = self.directory / "gunicorn.pid"
        inherited = {name: value for name, value in os.environ.items() if name != "PROMETHEUS_MULTIPROC_DIR"}
        self.env = {
            **inherited,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "REDIS_URL": redis_url,
            "WEB_CONCURRENCY": str(self.workers),
            "SHOAL_VAR_DIR": str(self.directory / "var"),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            **(env or {}),
        }
        bind = [] if (env or {}).get("PORT") else ["--bind", f"127.0.0.1:{self.port}"]
        self.args = ["-c", str(ROOT / "gunicorn.conf.py"), *bind,
                     "--pid", str(self.pidfile), "--log-level", "info", *args, app]
        self.lines = []
        self.proc = None

    def launch(self):
        """Start the master and return at once (``start`` waits for the workers)."""
        self.proc = subprocess.Popen([sys.executable, "-m", "gunicorn", *self.args], cwd=ROOT, env=self.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._collect, daemon=True).start()
        return self

    def start(self, timeout=60):
        self.launch()
        wait_for(self._answers, timeout=timeout, what=f"gunicorn on port {self.port} answering /healthz")
        # Ready, not only booted: a worker still importing the app when a test changes the code on disk
        # loads the new code (a test breaking it then lost an "old" worker that never had the old code).
        wait_for(lambda: len(self.worker_pids()) == self.workers and self.ready() >= self.workers,
                 timeout=timeout, what=f"{self.workers} gunicorn workers ready")
        return self

    def _collect(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def _answers(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"gunicorn exited with {self.proc.returncode}:\n{self.output()}")
        try:
            return get(self.port, "/healthz", timeout=2)[0] == 200
        except OSError:
            return False

    def output(self):
        return "".join(self.lines)

    def ready(self):
        """How many workers the master has logged ready (streams_app's rollout arbiter)."""
        return self.output().count(") is ready (app loaded in")

    def booted(self):
        return self.output().count("Booting worker with pid")

    def worker_pids(self):
        return children_of(self.proc.pid)

    def get(self, path, timeout=10):
        return get(self.port, path, timeout)

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, timeout=45):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
