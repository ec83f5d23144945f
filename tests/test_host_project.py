"""Shoal in someone else's Django project: the wheel built from this checkout, installed into a fresh
virtualenv beside a new ``django-admin startproject``, set up with the README's "Add Shoal to your
project" blocks as written.

The venv gets the wheel and its dependencies from the package index pip is configured with (as
``make deps`` does); nothing of this checkout is on its path (commands run from a temporary
directory, without PYTHONPATH), which the host's own script asserts: ``project`` is not importable
there and the apps come from the venv's site-packages. runconsumer runs as a supervisor with two
workers: they are started as ``python -m streams_app.supervisor.worker_main`` and must find the host's
settings and consumers.py too.
"""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import zipfile

import django
import pytest

from tests.host_project import PACKAGES, ROOT, build_wheel, get, host_env, make_host_project, readme_blocks, run
from tests.redis_server import RedisServer, free_port
from tests.waiting import wait_for


# The version matrix (noxfile.py) runs these on every supported Python and Django, beside the tests not marked slow.
pytestmark = pytest.mark.install

# The control room's own pages beside each model's list and change pages: True for those under a row.
# The logical-stream pages need a partitioned stream, which this host has not: tests/streams_app/admin/
# test_logical.py opens them, on every Django of the matrix.
EXTRA_VIEWS = {"streams_app_consumergroup_pending": True, "streams_app_consumergroup_replay_all": True,
               "streams_app_deadletter_replay": True, "streams_app_consumergroup_find": False}

# Run with the venv's python inside the host project: what the host sees, through its own urls.
PROBE = f"EXTRA_VIEWS = {EXTRA_VIEWS!r}\n" + '''
import importlib.util, json, os, sys
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "host.settings")
django.setup()
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import setup_test_environment

import streams_app

setup_test_environment()  # ALLOWED_HOSTS takes the test client's "testserver"; the database is the host's own

admin = User.objects.create_superuser("admin", "admin@example.com", "pw")
client = Client()
client.force_login(admin)

# Every page of the control room: each Shoal model's list, each row's page and history, and the pages
# the admins add under get_urls() (the pending entries, a replay with an edited payload, ...).
from django.contrib import admin as django_admin
from django.urls import reverse

paths = ["/admin/", "/healthz", "/readyz", "/metrics"]
for model in django_admin.site._registry:
    meta = model._meta
    if meta.app_label not in ("streams_app", "discovery_app"):
        continue
    name = f"admin:{meta.app_label}_{meta.model_name}"
    paths.append(reverse(f"{name}_changelist"))
    if not meta.managed:  # the Tasks page: an unmanaged model with no table, its list mounted by get_urls()
        continue
    for row in model._default_manager.all()[:1]:
        paths += [reverse(f"{name}_change", args=[row.pk]), reverse(f"{name}_history", args=[row.pk])]
        paths += [reverse(f"{name}_{extra}", args=[row.pk]) for extra in ("pending", "replay_all", "replay")
                  if f"{meta.app_label}_{meta.model_name}_{extra}" in EXTRA_VIEWS]
paths += [reverse(f"admin:{name}") for name in EXTRA_VIEWS if not EXTRA_VIEWS[name]]
pages = {path: client.get(path) for path in paths}
print(json.dumps({
    "status": {path: r.status_code for path, r in pages.items()},
    "django": django.get_version(),
    "dead_letters_page": pages["/admin/streams_app/deadletter/"].content.decode(),
    "groups_page": pages["/admin/streams_app/consumergroup/"].content.decode(),
    "healthz": pages["/healthz"].content.decode(),
    "metrics": pages["/metrics"].content.decode(),
    "project_importable": importlib.util.find_spec("project") is not None,
    "streams_app": streams_app.__file__,
    "sys_path": sys.path,
}))
'''


def test_the_readme_has_the_host_project_blocks():
    assert set(readme_blocks()) == {"settings.py", "urls.py"}


def assert_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == set(PACKAGES)  # not project/, tests/, bench/, demo/
    for expected in ("streams_app/lua/replay.lua", "streams_app/templates/admin/streams_app/summary.html",
                     "shoal_common/templates/admin/shoal/confirm_action.html", "streams_app/migrations/0001_initial.py",
                     "discovery_app/migrations/0001_initial.py", "streams_app/web/urls.py", "streams_app/web/gunicorn_conf.py",
                     *(f"{package}/py.typed" for package in PACKAGES)):
        assert expected in names, expected
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "requires-dist: django<6.2,>=5.2" in metadata.lower()
    # The licence and the project URLs (tests/test_package.py checks them and the PyPI page in detail).
    assert "License-Expression: BSD-3-Clause" in metadata and any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "Project-URL: Documentation, https://" in metadata


def web_tier(site, venv, env, manage):
    """gunicorn with the packaged config, as the README says: it serves and registers in discovery."""
    port = free_port()
    # DJANGO_SETTINGS_MODULE stays unset: the workers, and the registration process, learn it from host.wsgi.
    proc = subprocess.Popen([str(venv / "bin" / "gunicorn"), "-c", "python:streams_app.web.gunicorn_conf", "--bind",
                             f"127.0.0.1:{port}", "host.wsgi"], cwd=site, env={**env, "WEB_CONCURRENCY": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        def answers():
            assert proc.poll() is None, "".join(lines)
            try:
                return get(port, "/healthz")
            except OSError:
                return None

        healthz = wait_for(answers, timeout=120, what="the host's gunicorn answering /healthz")

        def registered():
            found = json.loads(run([*manage, "discover", "shoal-web", "--json"], cwd=site, env=env))["instances"]
            return found and found[0]["url"]

        url = wait_for(registered, timeout=120, interval=1, what="the web tier registered in discovery")
        metrics = get(port, "/metrics")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    left = json.loads(run([*manage, "discover", "shoal-web", "--json"], cwd=site, env=env))["instances"]
    return {"port": port, "healthz": healthz, "metrics": metrics, "registered": url, "returncode": proc.returncode,
            "left_registered": left, "output": "".join(lines)}


@pytest.mark.timeout(1200)
def test_a_fresh_startproject_runs_shoal_from_the_wheel(tmp_path):
    wheel = build_wheel(tmp_path)
    assert_wheel_contents(wheel)

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    env = host_env(venv, "redis://unused", tmp_path)
    # The Django of this test run: the matrix (noxfile.py) proves each supported Django in its own run.
    run([python, "-m", "pip", "install", "--quiet", f"{wheel}[gunicorn]", f"Django=={django.get_version()}"],
        cwd=tmp_path, env=env)

    server = RedisServer(tmp_path / "redis").start()
    try:
        out = tmp_path / "out"
        out.mkdir()
        env = host_env(venv, server.url, out)
        site = tmp_path / "site"
        site.mkdir()
        make_host_project(site, venv, env)
        manage = [python, "manage.py"]

        run([*manage, "check"], cwd=site, env=env)
        run([*manage, "migrate", "--verbosity", "0"], cwd=site, env=env)
        entry_id = run([*manage, "publish", "orders", '{"order_id": 7}'], cwd=site, env=env).strip()
        assert re.fullmatch(r"\d+-\d+", entry_id)

        consumer = subprocess.Popen([*manage, "runconsumer", "--workers", "2"], cwd=site, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
        try:
            redis_client = server.client()
            wait_for(lambda: (out / "shipped-7.json").exists() or consumer.poll() is not None, timeout=120,
                     what="the host's @consumer handling the message")
            assert consumer.poll() is None, consumer.stdout.read()
            assert json.loads((out / "shipped-7.json").read_text()) == {"order_id": 7}
            wait_for(lambda: redis_client.xlen("{orders}:dlq") == 1, timeout=120,
                     what="the failing handler's message dead-lettered")
        finally:
            consumer.send_signal(signal.SIGTERM)
            output, _ = consumer.communicate(timeout=120)
        assert consumer.returncode == 0, output

        run([*manage, "runreclaimer", "--once"], cwd=site, env=env)

        probe = json.loads(run([python, "-c", PROBE], cwd=site, env=env).strip().splitlines()[-1])
        dry_run = run([*manage, "replay", "orders", "--group", "audit", "--all", "--dry-run"], cwd=site, env=env)
        services = json.loads(run([*manage, "discover", "--json"], cwd=site, env=env))
        web = web_tier(site, venv, env, manage)
    finally:
        server.stop()

    assert probe["django"] == django.get_version()
    assert {path: status for path, status in probe["status"].items() if status != 200} == {}
    visited = set(probe["status"])
    for path in ("/admin/", "/admin/streams_app/stream/", "/admin/streams_app/consumergroup/",
                 "/admin/streams_app/deadletter/", "/admin/streams_app/outboxmessage/", "/admin/streams_app/replayjob/",
                 "/admin/discovery_app/serviceinstance/", "/admin/streams_app/consumergroup/find/"):
        assert path in visited, path
    for page in ("/pending/", "/replay/", "/replay-dead-letters/", "/history/"):
        assert any(path.endswith(page) for path in visited), page
    assert probe["healthz"] == "ok\n"
    assert "the audit service is down" in probe["dead_letters_page"]  # the audit group's dead letter, mirrored from Redis
    assert "shipping" in probe["groups_page"] and "audit" in probe["groups_page"]
    lag = [line for line in probe["metrics"].splitlines() if line.startswith("shoal_group_lag{")]
    assert any('group="shipping"' in line and 'stream="orders"' in line and line.endswith(" 0.0") for line in lag), lag
    assert "Would replay 1 dead letters of orders for group audit" in dry_run
    # discovery_app's commands answer too: no service is registered.
    assert services == {}
    assert web["healthz"] == (200, "ok\n") and web["metrics"][0] == 200
    assert web["registered"] == f"http://127.0.0.1:{web['port']}", web["output"]
    assert web["returncode"] == 0 and web["left_registered"] == [], web["output"]
    assert "Traceback" not in web["output"], web["output"]
    assert probe["project_importable"] is False
    assert probe["streams_app"].startswith(str(venv))
    assert not any(str(ROOT) in entry for entry in probe["sys_path"])


def test_a_host_project_without_the_redis_cache_gets_the_check_not_a_traceback(tmp_path):
    """Django's default CACHES (local memory): `check` names the setting to add, in the README's words."""
    settings = tmp_path / "hostsettings.py"
    settings.write_text(textwrap.dedent("""\
        SECRET_KEY = "x"
        INSTALLED_APPS = ["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                          "django.contrib.sessions", "django.contrib.messages", "streams_app", "discovery_app"]
        DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    """))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "hostsettings", "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    out = subprocess.run([sys.executable, "-m", "django", "check"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr, out.stderr
    for expected in ("streams_app.E005", "discovery_app.E009", "streams_app.E040", "redis_cache(REDIS_URL)"):
        assert expected in out.stderr, out.stderr


def test_a_host_manage_py_with_the_packaged_entry_point_reports_a_broken_consumers_py_in_one_line(tmp_path):
    """docs/install.md's manage.py: a consumers.py that fails to import is exit 3 and one line, not a traceback."""
    (tmp_path / "brokenapp").mkdir()
    (tmp_path / "brokenapp" / "__init__.py").write_text("")
    (tmp_path / "brokenapp" / "consumers.py").write_text("import a_module_nobody_installed\n")
    (tmp_path / "hostsettings.py").write_text(textwrap.dedent("""\
        from shoal_common.cache import redis_cache
        SECRET_KEY = "x"
        INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "shoal_common", "streams_app", "brokenapp"]
        DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
        CACHES = {"default": redis_cache("redis://127.0.0.1:1/0")}
    """))
    (tmp_path / "manage.py").write_text(textwrap.dedent("""\
        import os, sys

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsettings")
        from streams_app.commandline import execute_from_command_line

        execute_from_command_line(sys.argv)
    """))
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)  # the apps from this checkout; the host's modules from its own directory
    out = subprocess.run([sys.executable, "manage.py", "runconsumer"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 3, out.stderr
    assert out.stderr.startswith("Configuration error in consumers.py: importing brokenapp.consumers failed"), out.stderr
    assert "Traceback" not in out.stderr
