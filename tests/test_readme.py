"""The README's quick start, run as written: from a clean clone, `make run`, then its commands in a new shell.

The clone is a ``git clone`` of this checkout's HEAD into a temporary directory. Its ``.venv`` is a
link to the one this test runs in (installing packages is ``make deps``' job, and tests have no
network); everything else is the clone's own: ``var/``, the SQLite database, ``var/env``. The
commands of each README block marked ``<!-- quick-start: ... -->`` run verbatim in ``bash`` with a
fresh environment: no virtualenv, no ``REDIS_URL``, no Django settings, only ``PATH`` and ``HOME``.
``make run`` gets its own Redis (``REDIS_URL``) and a free web port (``SHOAL_WEB_PORT``), never the
shared ones, and is stopped the way a terminal's Ctrl-C stops it: SIGINT to its process group.
"""
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.processes import descendants
from tests.redis_server import free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"<!-- quick-start: (?P<name>[^>]*?) -->\n```sh\n(?P<body>.*?)```", re.S)
# Step 5's publishing code, which the README says runs as written in `python manage.py shell`.
TOUR_CODE = re.compile(r"<!-- tour: publish from code -->\n```python\n(?P<body>.*?)```", re.S)
FRESH_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}


def quick_start_blocks(readme_text):
    return {m["name"]: m["body"] for m in BLOCK.finditer(readme_text)}


def test_the_readme_marks_its_quick_start_blocks():
    blocks = quick_start_blocks((ROOT / "README.md").read_text())
    assert list(blocks) == ["second shell", "a message that fails", "replay from the shell"]
    assert "make run" in (ROOT / "README.md").read_text().split("<!-- quick-start: second shell -->")[0]
    assert len(TOUR_CODE.findall((ROOT / "README.md").read_text())) == 1


class MakeRun:
    def __init__(self, clone, env):
        self.lines = []
        self.proc = subprocess.Popen(["make", "run"], cwd=clone, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self):
        return "".join(self.lines)

    def wait_for(self, pattern, timeout=120):
        def seen():
            if self.proc.poll() is not None:
                raise AssertionError(f"make run exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            return re.search(pattern, self.output())
        return wait_for(seen, timeout=timeout, interval=0.2, what=f"{pattern!r} in make run's output")

    def ctrl_c(self):
        os.killpg(self.proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the foreground process group

    def kill_everything(self):
        for pid in [*reversed(descendants(self.proc.pid)), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def clone(tmp_path):
    target = tmp_path / "shoal"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(target)], check=True)
    venv = Path(sys.prefix)
    (target / ".venv").symlink_to(venv)
    stamp = venv / ".installed-requirements"
    if stamp.exists():  # the clone's requirements files are as new as the clone: not a reason to reinstall
        older = stamp.stat().st_mtime - 60
        for requirements in (target / "requirements.txt", *(target / "requirements").glob("*.txt")):
            os.utime(requirements, (older, older))
    return target


class Shell:
    """One bash session, like the README's second terminal: an activated venv stays active."""

    def __init__(self, cwd):
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], cwd=cwd, env=FRESH_ENV, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines = queue.SimpleQueue()
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()

    def run(self, block, timeout=120):
        """Run each command line of ``block``; each must exit 0. Return the output."""
        output = []
        for number, command in enumerate(line for line in block.splitlines() if line.strip()):
            marker = f"__exit_{number}__"
            self.proc.stdin.write(f"{command}\necho {marker} $?\n")
            self.proc.stdin.flush()
            deadline = time.monotonic() + timeout
            while True:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
                if line.startswith(marker):
                    status = int(line.split()[1])
                    break
                output.append(line)
            assert status == 0, f"{command}\nexited {status}:\n{''.join(output)}"
        return "".join(output)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def wait_for_text(url, text, timeout=60):
    def body():
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                page = response.read().decode()
        except OSError:
            return None
        return page if text in page else None

    return wait_for(body, timeout=timeout, interval=0.5, what=f"{text!r} at {url}")


def test_the_quick_start_works_as_written_from_a_clean_clone(clone, redis_factory):
    blocks = quick_start_blocks((clone / "README.md").read_text())
    [tour_code] = TOUR_CODE.findall((clone / "README.md").read_text())
    server = redis_factory()
    second = Shell(clone)
    run = MakeRun(clone, {**FRESH_ENV, "REDIS_URL": server.url, "SHOAL_WEB_PORT": str(free_port())})
    try:
        run.wait_for(r"Shoal: starting Procfile\.dev", timeout=240)
        run.wait_for(r"email: confirmation for order \d+", timeout=120)
        run.wait_for(r"points: \+\d+ points", timeout=60)
        # The metrics URLs make run prints answer, each with its own figures.
        web, consumer, reclaimer = (run.wait_for(rf"{label} (http://\S+/metrics)", timeout=10).group(1)
                                    for label in ("metrics", "consumer metrics", "outbox metrics"))
        assert "django_http_requests_total_by_method_total" in wait_for_text(web, "django_http")
        assert 'shoal_messages_handled_total{' in wait_for_text(consumer, "shoal_messages_handled_total{")
        assert "shoal_outbox_rows" in wait_for_text(reclaimer, "shoal_outbox_rows")

        out = second.run(blocks["second shell"])
        assert "shoal-web" in out  # discover: the web tier registered itself
        # The tour's ids and customers are ones the demo producer never uses (its orders are 1, 2, 3, ...
        # for ann, bo and cy), so only the tour's own orders match.
        run.wait_for(r"email: confirmation for order tour-1 ", timeout=60)
        run.wait_for(r"points: \+12 points for customer dee", timeout=60)
        # The README's other way into that shell: `make shell` (a bash with .venv active after ~/.bashrc).
        made = subprocess.run(["make", "shell"], cwd=clone, env=FRESH_ENV, input="python manage.py discover\nexit\n",
                              capture_output=True, text=True, timeout=120)
        assert made.returncode == 0 and "shoal-web" in made.stdout, made.stdout + made.stderr

        second.run(blocks["a message that fails"])
        run.wait_for(r"moved 1 entries of orders/email to \{orders\}:dlq", timeout=120)

        dry_run, replay = [line for line in blocks["replay from the shell"].splitlines() if line.strip()]
        assert "Would replay 1 dead letters of orders for group email" in second.run(dry_run)
        assert "Replayed 1 dead letters" in second.run(replay)
        run.wait_for(r"email: confirmation for order tour-2 ", timeout=60)

        # Step 5's code as written, with nothing imported for it (Django 5.2's shell imports the models).
        ran = subprocess.run([str(clone / ".venv" / "bin" / "python"), "manage.py", "shell", "--no-imports",
                              "-c", tour_code], cwd=clone, env=FRESH_ENV, capture_output=True, text=True,
                             timeout=120)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        run.wait_for(r"email: confirmation for order tour-3 ", timeout=60)
        run.wait_for(r"points: \+9 points for customer dee", timeout=60)  # the outbox one: Order(total=99)

        before_stop = len(run.output())
        run.ctrl_c()
        run.proc.wait(timeout=120)
        stop = run.output()[before_stop:]  # (the tour's failing handler printed tracebacks before this)
        assert "Shoal: stopped." in stop, stop
        assert "rc=-15" not in stop, stop
        assert "Error 130" not in stop and "Traceback" not in stop, stop
        for process in ("web", "consumer", "producer", "reclaimer"):
            assert re.search(rf"{process}\.1 stopped \(rc=0\)", stop), stop
    finally:
        run.kill_everything()
        second.close()
