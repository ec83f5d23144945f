"""The web tier in a host project: a fresh ``django-admin startproject`` with Django's stock wsgi.py and
the README's blocks, the wheel of this checkout in a venv of its own, gunicorn started as the README says
(``gunicorn -c python:streams_app.web.gunicorn_conf host.wsgi``).

What the reference deployment's project/wsgi.py cannot hide here: a deploy that cannot load (a view
that imports a missing module, a setting the system checks refuse, a middleware that fails every
request) must leave the old code serving on HUP and halt a first start, because the packaged config
checks the app before a worker says it is ready; and /readyz must fail while the application cannot
answer, also with HealthCheckMiddleware first and under a server that is not Shoal's.
"""
import json
import re
import signal
import subprocess
import sys
import time

import django
import pytest

from tests.host_project import ROOT, HostGunicorn, build_wheel, get, host_env, make_host_project, run
from tests.redis_server import free_port
from tests.serving.load import Load
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

VIEWS = 'from django.http import HttpResponse\n\n\ndef index(request):\n    return HttpResponse("{text}")\n'
BROKEN_VIEWS = "import a_module_nobody_installed  # noqa\n" + VIEWS.format(text="never served")
BROKEN_MIDDLEWARE = '''
class Broken:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        raise RuntimeError("broken middleware: every request fails")
'''
OUTCOME = re.compile(r"ROLLOUT ABORTED|Rollout complete")
# Python hides DeprecationWarnings raised outside __main__; a user shows them this way (python -W default).
SHOW_WARNINGS = {"PYTHONWARNINGS": "default::DeprecationWarning"}
FORK_WARNING = "use of fork() may lead to deadlocks"
MAX_REQUESTS = 200


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """One venv with the wheel (and gunicorn) for the module's host projects."""
    tmp = tmp_path_factory.mktemp("host-venv")
    wheel = build_wheel(tmp)
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    # The Django of this test run, as tests/test_host_project.py does (each supported Django in its own run).
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[gunicorn]",
         f"Django=={django.get_version()}"], cwd=tmp, env=host_env(venv, "redis://unused", tmp))
    return venv


@pytest.fixture
def site(tmp_path, venv, redis_server):
    """(site directory, venv, env): a fresh startproject with the README's blocks and a /shop/ view."""
    env = host_env(venv, redis_server.url, tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    make_host_project(site, venv, env)
    (site / "shop" / "views.py").write_text(VIEWS.format(text="old code"))
    with open(site / "host" / "urls.py", "a") as f:
        f.write('\nfrom shop import views  # noqa: E402\n\nurlpatterns += [path("shop/", views.index)]\n')
    return site, venv, env


@pytest.fixture
def servers():
    started = []
    yield started
    for server in started:
        server.stop()


def outcomes(server):
    return OUTCOME.findall(server.output())


def hup_and_wait(server):
    """HUP the master; the rollout's outcome ("ROLLOUT ABORTED" or "Rollout complete")."""
    before = len(outcomes(server))
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: len(outcomes(server)) > before, timeout=120, interval=0.2, what="the rollout's outcome")
    return outcomes(server)[before]


def test_a_deploy_that_cannot_load_leaves_the_old_code_serving_in_a_host_project(site, servers):
    site, venv, env = site
    settings = site / "host" / "settings.py"
    original_settings = settings.read_text()
    server = HostGunicorn(site, venv, env, port=free_port(), workers=2)
    servers.append(server)
    wait_for(lambda: server.answers("/shop/") == 200, timeout=120, what="the host's gunicorn serving /shop/")
    wait_for(lambda: server.output().count(") is ready (app loaded") >= 2, timeout=60, what="both workers ready")
    load = Load(server.port, "/shop/", clients=4, max_requests=200_000).start()
    try:
        wait_for(lambda: load.count() >= 100, timeout=60, what="100 requests before the first deploy")

        # 1. A view module that imports a missing module: Django's stock wsgi.py loads no URLconf.
        (site / "shop" / "views.py").write_text(BROKEN_VIEWS)
        assert hup_and_wait(server) == "ROLLOUT ABORTED", server.output()[-4000:]
        assert "a_module_nobody_installed" in server.output()  # the worker's traceback, for the operator

        # 2. A setting the system checks refuse (manage.py check says streams_app.E031).
        (site / "shop" / "views.py").write_text(VIEWS.format(text="old code"))
        settings.write_text(original_settings + '\nSTREAMS = {"PARTITIONS": "not-a-number"}\n')
        assert hup_and_wait(server) == "ROLLOUT ABORTED", server.output()[-4000:]
        assert "streams_app.E031" in server.output()

        # 3. Code that imports and passes the checks but fails every request: the internal request sees it.
        (site / "shop" / "middleware.py").write_text(BROKEN_MIDDLEWARE)
        settings.write_text(original_settings + '\nMIDDLEWARE += ["shop.middleware.Broken"]\n')
        assert hup_and_wait(server) == "ROLLOUT ABORTED", server.output()[-4000:]
        assert "broken middleware: every request fails" in server.output()

        served_old_at = time.monotonic()
        wait_for(lambda: sum(r.started > served_old_at for r in load.results) >= 100, timeout=60,
                 what="100 requests after the aborted rollouts")
        for path in ("/admin/login/", "/healthz", "/metrics"):
            assert get(server.port, path)[0] == 200, path
        status, body = get(server.port, "/readyz")
        assert status == 200 and json.loads(body)["checks"]["application"] == "ok", body

        # Fixed: the next HUP rolls forward.
        settings.write_text(original_settings)
        (site / "shop" / "views.py").write_text(VIEWS.format(text="new code"))
        exited = server.output().count("Worker exiting (pid:")
        assert hup_and_wait(server) == "Rollout complete", server.output()[-4000:]
        # An old worker still answers its kept-alive connections while it drains (up to gthread's 2 s): the
        # new code alone is served once both old workers have exited.
        wait_for(lambda: server.output().count("Worker exiting (pid:") >= exited + 2, timeout=60,
                 what="the two old workers exited")
        fixed_at = time.monotonic()
        wait_for(lambda: sum(r.started > fixed_at for r in load.results) >= 100, timeout=60,
                 what="100 requests after the fixed deploy")
    finally:
        load.stop()
    failures = load.failures()
    assert failures == [], f"{len(failures)} of {load.count()} requests failed, e.g. {failures[:3]}"
    assert {r.body for r in load.results} <= {"old code", "new code"}
    assert {r.body for r in load.results if r.started > fixed_at} == {"new code"}


@pytest.mark.install
def test_after_an_aborted_rollout_recycling_never_swaps_the_old_workers_for_ones_that_cannot_load(site, servers):
    # Issue 48: max_requests recycling replaced the old workers one by one with workers that could not load
    # the broken code, and the site stopped after a few times max_requests.
    site, venv, env = site
    server = HostGunicorn(site, venv, {**env, "GUNICORN_MAX_REQUESTS": str(MAX_REQUESTS), **SHOW_WARNINGS},
                          port=free_port(), workers=2)
    servers.append(server)
    wait_for(lambda: server.answers("/shop/") == 200, timeout=120, what="the host's gunicorn serving /shop/")
    wait_for(lambda: server.output().count(") is ready (app loaded") >= 2, timeout=60, what="both workers ready")
    load = Load(server.port, "/shop/", clients=4, max_requests=200_000).start()
    try:
        wait_for(lambda: load.count() >= 100, timeout=60, what="100 requests before the broken deploy")
        (site / "shop" / "views.py").write_text(BROKEN_VIEWS)
        assert hup_and_wait(server) == "ROLLOUT ABORTED", server.output()[-4000:]
        aborted_at = time.monotonic()
        # Three times max_requests with its 10 % jitter: recycling would have replaced both workers by then.
        target = 3 * (MAX_REQUESTS + MAX_REQUESTS // 10)
        try:
            wait_for(lambda: sum(r.started > aborted_at for r in load.results) >= target, timeout=180,
                     what=f"{target} requests after the aborted rollout")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {len(load.failures())} failed so far, e.g. {load.failures()[:3]}\n"
                                 + server.output()[-6000:]) from None
        output = server.output()
        assert "RECYCLING HELD" in output and "keeps serving with the code it loaded" in output, output[-4000:]
        status, body = get(server.port, "/readyz")
        assert status == 200 and json.loads(body)["web_rollout"]["recycling"] == "held", body
        assert "shoal_web_recycling_held 1.0" in get(server.port, "/metrics")[1]

        fixing_at = time.monotonic()
        (site / "shop" / "views.py").write_text(VIEWS.format(text="new code"))
        exited = server.output().count("Worker exiting (pid:")
        assert hup_and_wait(server) == "Rollout complete", server.output()[-4000:]
        # An old worker still answers its kept-alive connections while it drains (up to gthread's 2 s): the
        # new code alone is served once both old workers have exited.
        wait_for(lambda: server.output().count("Worker exiting (pid:") >= exited + 2, timeout=60,
                 what="the two old workers exited")
        fixed_at = time.monotonic()
        wait_for(lambda: sum(r.started > fixed_at for r in load.results) >= 100, timeout=60,
                 what="100 requests after the fixed deploy")
    finally:
        load.stop()
    failures = load.failures()
    assert failures == [], f"{len(failures)} of {load.count()} requests failed, e.g. {failures[:3]}"
    assert {r.body for r in load.results if r.started < fixing_at} == {"old code"}
    assert {r.body for r in load.results if r.started > fixed_at} == {"new code"}
    assert json.loads(get(server.port, "/readyz")[1])["web_rollout"]["recycling"] == "normal"
    assert "Recycling resumed" in server.output()
    if sys.version_info >= (3, 12):
        assert FORK_WARNING not in server.output()


@pytest.mark.install
@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python warns about fork() in a multi-threaded process "
                                                       "from 3.12 on; the version matrix runs this on 3.12 and 3.13")
def test_the_master_forks_its_workers_from_one_thread(site, servers):
    # Issue 48: the registration supervisor was a thread of the master, and gunicorn's control socket another.
    site, venv, env = site
    server = HostGunicorn(site, venv, {**env, "GUNICORN_MAX_REQUESTS": "20", **SHOW_WARNINGS}, port=free_port(),
                          workers=2)
    servers.append(server)
    wait_for(lambda: server.answers("/shop/") == 200, timeout=120, what="the host's gunicorn serving /shop/")
    assert "Discovery registration started" in server.output()
    booted = server.output().count("Booting worker")
    # Forks of every kind: the first workers, recycled ones, and a rollout's. Requests until two workers
    # were recycled: how many that takes depends on which worker accepts each (a fixed 100 could all but
    # miss the second worker while the first one's replacement was booting).

    def recycled_twice():
        assert get(server.port, "/shop/")[0] == 200
        return server.output().count("Booting worker") >= booted + 2

    wait_for(recycled_twice, timeout=120, interval=0, what="two workers recycled after max_requests (20)")
    assert hup_and_wait(server) == "Rollout complete", server.output()[-4000:]
    assert FORK_WARNING not in server.output(), server.output()[-4000:]


def test_a_first_start_with_code_that_cannot_load_halts_with_exit_3(site, servers):
    # Three starts: the master's exit path once crashed now and then (a race on its status file), exit 1.
    site, venv, env = site
    (site / "shop" / "views.py").write_text(BROKEN_VIEWS)
    for attempt in range(3):
        server = HostGunicorn(site, venv, env, port=free_port(), workers=1)
        servers.append(server)
        try:
            returncode = server.proc.wait(120)
        except subprocess.TimeoutExpired:
            raise AssertionError("gunicorn did not halt:\n" + server.output()[-4000:]) from None
        output = server.output()
        assert returncode == 3, f"attempt {attempt}: exit {returncode}\n{output[-4000:]}"
        assert "a_module_nobody_installed" in output and "No worker could load the application" in output, output
        assert "Exception in on_exit" not in output and "FileNotFoundError" not in output, output


def test_readyz_fails_while_the_application_cannot_load_with_the_middleware_first(site, servers):
    # docs/install.md: HealthCheckMiddleware first in MIDDLEWARE. Served by a plain `gunicorn host.wsgi`
    # (any WSGI server): nothing checked the app at boot, every page is a 500, and /readyz must say so.
    site, venv, env = site
    with open(site / "host" / "settings.py", "a") as f:
        f.write('\nMIDDLEWARE = ["streams_app.web.health.HealthCheckMiddleware", *MIDDLEWARE]\n')
    (site / "shop" / "views.py").write_text(BROKEN_VIEWS)
    server = HostGunicorn(site, venv, env, port=free_port(), workers=1, config=None)
    servers.append(server)
    assert wait_for(lambda: server.answers("/healthz"), timeout=120, what="plain gunicorn answering") == 200
    # A sync worker, and Django's debug page for the 500: slow on a loaded machine.
    assert get(server.port, "/shop/", timeout=60)[0] == 500
    status, body = get(server.port, "/readyz", timeout=60)
    assert status == 503, body
    body = json.loads(body)
    assert body["status"] == "unavailable" and body["failing"] == ["application"], body
    assert body["checks"] == {"redis": "ok", "database": "ok", "application": "cannot load"}, body
    assert "a_module_nobody_installed" not in json.dumps(body)  # the cause goes to the log, not to probes
    assert "a_module_nobody_installed" in server.output()


METRICS_BLOCK = re.compile(r"<!-- host-metrics: settings.py -->\n```python\n(?P<body>.*?)```", re.S)
SHOP_REQUESTS = re.compile(r'^django_http_requests_total_by_view_transport_method_total\{(?=[^}]*method="GET")'
                           r'(?=[^}]*view="shop\.views\.index")[^}]*\} (?P<count>\S+)$', re.M)


def test_request_metrics_added_as_install_md_says_are_served_by_shoals_metrics_across_workers(site, servers):
    # Issue 34 (round 3, F4): a host project's /metrics has no django-prometheus request metrics, and
    # docs/install.md "Request metrics in your project" says how to add them; this follows it as written.
    site, venv, env = site
    server = HostGunicorn(site, venv, env, port=free_port(), workers=2)
    servers.append(server)
    wait_for(lambda: server.answers("/shop/") == 200, timeout=120, what="the host's gunicorn serving /shop/")
    wait_for(lambda: server.output().count(") is ready (app loaded") >= 2, timeout=60, what="both workers ready")
    status, body = get(server.port, "/metrics")
    assert status == 200 and "shoal_backlog_scrape_ok 1.0" in body, body[-2000:]
    assert "django_http_" not in body  # what serving.md says the packaged /metrics has not

    install = ["--no-deps", "django-prometheus==2.5.0"] if django.VERSION >= (6, 1) else ["django-prometheus"]
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *install], cwd=site, env=env)
    [block] = METRICS_BLOCK.findall((ROOT / "docs" / "install.md").read_text())
    with open(site / "host" / "settings.py", "a") as f:
        f.write("\n# Added per docs/install.md 'Request metrics in your project'\n" + block)
    assert hup_and_wait(server) == "Rollout complete", server.output()[-4000:]
    wait_for(lambda: server.output().count(") is ready (app loaded") >= 4, timeout=60, what="two new workers ready")

    for _ in range(20):  # a connection each: the kernel hands them to either worker
        assert get(server.port, "/shop/")[0] == 200
    status, body = get(server.port, "/metrics")
    assert status == 200 and "shoal_backlog_scrape_ok 1.0" in body, body[-2000:]
    counts = [float(m["count"]) for m in SHOP_REQUESTS.finditer(body)]
    assert counts == [20.0], [line for line in body.splitlines() if "shop" in line]
