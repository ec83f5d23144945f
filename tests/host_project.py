"""A host project as a user makes one: the wheel built from this checkout, installed into a fresh
virtualenv beside a new ``django-admin startproject``, set up with the README's "Add Shoal to your
project" blocks as written (tests/test_host_project.py and the web tier's host-project tests use it).

The venv gets the wheel and its dependencies from the package index pip is configured with (as
``make deps`` does); nothing of this checkout is on its path (commands run from a temporary
directory, without PYTHONPATH).
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.serving.gunicorn_process import get


ROOT = Path(__file__).resolve().parent.parent
HOST_BLOCK = re.compile(r"<!-- host-project: (?P<file>[\w.]+) -->\n```python\n(?P<body>.*?)```", re.S)
PACKAGES = ("streams_app", "discovery_app", "shoal_common")

CONSUMERS = '''
import http.client
import json
import os
from pathlib import Path

from streams_app import consumer

OUT = Path(os.environ.get("SHOP_OUT", "."))


@consumer("orders", group="shipping")
def ship(message):
    # Written aside, then renamed: the test waits for the file and must never read it half-written.
    path = OUT / f"shipped-{message.payload['order_id']}.json"
    path.with_suffix(".tmp").write_text(json.dumps(message.payload))
    os.replace(path.with_suffix(".tmp"), path)


@consumer("orders", group="audit", max_deliveries=1)
def audit(message):
    raise ValueError("the audit service is down")
'''


def readme_blocks():
    return {m["file"]: m["body"] for m in HOST_BLOCK.finditer((ROOT / "README.md").read_text())}


def checkout_copy(dest):
    """The checkout's files as git sees them (tracked, and new ones not ignored): no .venv, var/, build/."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def run(args, **kwargs):
    out = subprocess.run(args, capture_output=True, text=True, **{"timeout": 600, **kwargs})
    assert out.returncode == 0, f"{args} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def build_wheel(tmp_path):
    source = checkout_copy(tmp_path / "checkout")
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(source)])
    [wheel] = wheels.glob("django_shoal-*.whl")
    return wheel


def host_env(venv, redis_url, out):
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}", VIRTUAL_ENV=str(venv), REDIS_URL=redis_url,
               SHOP_OUT=str(out), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def make_host_project(site, venv, env):
    run([str(venv / "bin" / "django-admin"), "startproject", "host", str(site)], cwd=site.parent, env=env)
    blocks = readme_blocks()
    for name, block in blocks.items():
        with open(site / "host" / name, "a") as f:
            f.write("\n# Added per the README's 'Add Shoal to your project'\n" + block)
    run([str(venv / "bin" / "python"), "manage.py", "startapp", "shop"], cwd=site, env=env)
    (site / "shop" / "consumers.py").write_text(CONSUMERS)
    with open(site / "host" / "settings.py", "a") as f:
        f.write('\nINSTALLED_APPS += ["shop"]\n')


class HostGunicorn:
    """The host's gunicorn started as the README says (``gunicorn -c python:streams_app.web.gunicorn_conf
    host.wsgi``; ``config=None``: plain ``gunicorn host.wsgi``), from the site's directory, with the
    venv's gunicorn and nothing of this checkout on its path. Output is collected as it comes."""

    def __init__(self, site, venv, env, *, port, workers=2, config="python:streams_app.web.gunicorn_conf"):
        self.port = port
        args = [str(venv / "bin" / "gunicorn"), *(["-c", config] if config else []), "--bind", f"127.0.0.1:{port}",
                "host.wsgi"]
        self.lines = []
        self.proc = subprocess.Popen(args, cwd=site, env={**env, "WEB_CONCURRENCY": str(workers)},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def output(self):
        return "".join(self.lines)

    def answers(self, path="/healthz"):
        """The status of ``path`` once the server answers, None while it does not (yet)."""
        assert self.proc.poll() is None, f"gunicorn exited {self.proc.returncode}:\n{self.output()}"
        try:
            return get(self.port, path)[0]
        except OSError:
            return None

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
