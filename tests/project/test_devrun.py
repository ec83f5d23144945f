"""make run's first-run admin user: created once, password printed once and stored 0600."""
import http.client
import json
import os
import signal
import stat
import subprocess
import sys
import threading

import pytest

from pathlib import Path

from project.devrun import ROOT, create_admin_once
from tests.host_project import checkout_copy
from tests.redis_server import free_port
from tests.waiting import wait_for

FRESH_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}


@pytest.fixture
def env(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings", "DEBUG": "1",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "SHOAL_VAR_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=120)
    return env


def login_works(env, password):
    check = f"from django.contrib.auth import authenticate; print(bool(authenticate(username='admin', password={password!r})))"
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", check], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip().splitlines()[-1:] == ["True"]


def test_first_run_creates_the_admin_and_later_runs_do_not(env, tmp_path):
    password = create_admin_once(sys.executable, env, var=tmp_path)
    secret = tmp_path / "admin-password"
    assert password and secret.read_text() == password + "\n"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert login_works(env, password)

    assert create_admin_once(sys.executable, env, var=tmp_path) is None
    assert secret.read_text() == password + "\n"


def test_an_existing_admin_without_a_password_file_is_left_alone(env, tmp_path, capsys):
    first = create_admin_once(sys.executable, env, var=tmp_path)
    (tmp_path / "admin-password").unlink()
    assert create_admin_once(sys.executable, env, var=tmp_path) is None
    assert "already exists" in capsys.readouterr().out
    assert not (tmp_path / "admin-password").exists()
    assert login_works(env, first)


def test_var_env_fills_in_what_the_environment_lacks(tmp_path):
    from project.devenv import load_dev_env, read_env, write_env

    path = write_env({"REDIS_URL": "redis://127.0.0.1:6390/0", "DEBUG": "1", "SHOAL_DEMO": "1"}, tmp_path / "env")
    assert read_env(path) == {"REDIS_URL": "redis://127.0.0.1:6390/0", "DEBUG": "1", "SHOAL_DEMO": "1"}
    environ = {"REDIS_URL": "redis://elsewhere:6379/0"}
    assert load_dev_env(environ, path) == ["DEBUG", "SHOAL_DEMO"]
    assert environ == {"REDIS_URL": "redis://elsewhere:6379/0", "DEBUG": "1", "SHOAL_DEMO": "1"}


def test_var_env_is_ignored_under_another_settings_module(tmp_path):
    from project.devenv import load_dev_env, write_env

    path = write_env({"SHOAL_DEMO": "1"}, tmp_path / "env")
    environ = {"DJANGO_SETTINGS_MODULE": "tests.settings"}
    assert load_dev_env(environ, path) == [] and "SHOAL_DEMO" not in environ
    assert load_dev_env({}, tmp_path / "missing") == []


def test_manage_py_reads_var_env_in_a_new_shell(tmp_path):
    # A second shell after `make run`: nothing exported, yet manage.py finds DEBUG (no SECRET_KEY
    # needed) and the demo app.
    from project.devenv import write_env

    var = tmp_path / "var"
    write_env({"DEBUG": "1", "SHOAL_DEMO": "1"}, var / "env")
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "SHOAL_VAR_DIR": str(var),
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    code = "from django.conf import settings; print('demo' in settings.INSTALLED_APPS, settings.DEBUG)"
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["True", "True"]


@pytest.mark.parametrize("target", ["run", "dev-env"])
def test_make_run_installs_redis_server_when_missing_and_no_browser(target):
    # Issue 51: `make run` depended on the tests' system-deps and ran `apt-get install chromium`
    # (a demo installing a browser system-wide, or stopping with "Error 100" where apt-get cannot).
    planned = subprocess.run(["make", "-n", target], cwd=ROOT, env=FRESH_ENV, capture_output=True, text=True,
                             timeout=60)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "apt-get install -y redis-server" in planned.stdout
    assert "chromium" not in planned.stdout


@pytest.mark.parametrize("target", ["test", "test-fast", "test-matrix"])
def test_the_test_targets_still_install_chromium(target):
    planned = subprocess.run(["make", "-n", target], cwd=ROOT, env=FRESH_ENV, capture_output=True, text=True,
                             timeout=60)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "apt-get install -y chromium" in planned.stdout


SQLITE_AS_CONNECTED = """
import json, sqlite3
from django.db import connection, transaction
with connection.cursor() as cursor:
    pragmas = {name: cursor.execute(f"PRAGMA {name}").fetchone()[0]
               for name in ("journal_mode", "busy_timeout", "synchronous")}
with transaction.atomic():
    # IMMEDIATE: the write lock is the atomic block's from BEGIN on, before it wrote anything.
    other = sqlite3.connect(connection.settings_dict["NAME"], timeout=0)
    try:
        other.execute("BEGIN IMMEDIATE")
        pragmas["write_lock_at_begin"] = False
    except sqlite3.OperationalError as exc:
        pragmas["write_lock_at_begin"] = "locked" in str(exc)
    other.close()
print(json.dumps(pragmas))
"""


def test_make_runs_sqlite_is_set_up_for_several_processes(env):
    # Issue 51: under `make run` the producer, the outbox relay and the admin mirror share this file;
    # in rollback-journal mode with the 5 s default timeout the mirror logged "database is locked".
    # Read back through the connection project.settings configures, not from the settings dict.
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", SQLITE_AS_CONNECTED], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pragmas = json.loads(done.stdout.strip().splitlines()[-1])
    assert pragmas["journal_mode"] == "wal"
    assert pragmas["busy_timeout"] >= 20_000  # milliseconds
    assert pragmas["synchronous"] == 1  # NORMAL
    assert pragmas["write_lock_at_begin"] is True


def status_of(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_servings_first_command_works_after_make_dev_env_in_a_new_shell(tmp_path, redis_server, redis):
    # docs/serving.md's first command, `gunicorn project.wsgi`, in a shell where only the venv is active:
    # it failed with "SECRET_KEY is not set", var/env (DEBUG=1, REDIS_URL) being read by manage.py only.
    checkout = checkout_copy(tmp_path / "shoal")
    venv = Path(sys.prefix)
    (checkout / ".venv").symlink_to(venv)
    stamp = venv / ".installed-requirements"
    if stamp.exists():  # the copy's requirements.txt is not newer than the venv: nothing to install
        older = stamp.stat().st_mtime - 60
        os.utime(checkout / "requirements.txt", (older, older))
    prepared = subprocess.run(["make", "dev-env"], cwd=checkout, env={**FRESH_ENV, "REDIS_URL": redis_server.url},
                              capture_output=True, text=True, timeout=300)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    port = free_port()
    # As serving.md writes it, from the repository root; the port is the test's own (8000 may be taken).
    proc = subprocess.Popen(["bash", "-c", f"source .venv/bin/activate && exec gunicorn project.wsgi "
                                           f"--bind 127.0.0.1:{port}"],
                            cwd=checkout, env=FRESH_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        def answers():
            assert proc.poll() is None, f"gunicorn exited {proc.returncode}:\n{''.join(lines)}"
            return status_of(port, "/healthz")

        assert wait_for(answers, timeout=120, interval=0.2, what="gunicorn project.wsgi answering") == 200
        assert status_of(port, "/admin/login/") == 200
        # var/env's REDIS_URL, the one make dev-env chose: the web tier registered there.
        wait_for(lambda: redis.hlen("discovery:{shoal-web}:instances") == 1, timeout=60,
                 what="the web tier registered in the Redis make dev-env chose")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, "".join(lines)
