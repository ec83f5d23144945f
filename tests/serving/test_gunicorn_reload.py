"""kill -HUP on a real gunicorn master under load: new code answers and no request fails."""
import signal
import time

import pytest

from tests.serving.hup_site import BROKEN_MIDDLEWARE, VIEW
from tests.serving.load import Load
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


def reload_and_wait(server, old_pids):
    server.signal(signal.SIGHUP)
    wait_for(lambda: set(server.worker_pids()).isdisjoint(old_pids) and len(server.worker_pids()) == server.workers,
             timeout=60, what="every old worker replaced after HUP")
    return server.worker_pids()


def test_hup_twice_under_load_loads_new_code_and_fails_no_request(gunicorn, site):
    server = gunicorn(workers=2, env={"PYTHONPATH": str(site), "DJANGO_SETTINGS_MODULE": "hup_settings"})
    load = Load(server.port, "/version", clients=4, max_requests=20_000).start()
    try:
        wait_for(lambda: load.count() >= 300, timeout=60, what="300 requests before the first HUP")
        pids = reload_and_wait(server, server.worker_pids())  # same code: a plain rolling restart
        first_done = load.count()
        (site / "hup_view.py").write_text(VIEW.format(text="new code, second version"))
        wait_for(lambda: load.count() >= first_done + 300, timeout=60, what="300 requests between the HUPs")
        reload_and_wait(server, pids)
        reloaded_at = time.monotonic()
        wait_for(lambda: load.count() >= 2_400 and sum(r.started > reloaded_at for r in load.results) >= 300,
                 timeout=120, what="2,400 requests in all, 300 of them after the second reload")
    finally:
        load.stop()

    failures = load.failures()
    assert failures == [], f"{len(failures)} of {load.count()} requests failed, e.g. {failures[:3]}"
    assert {r.body for r in load.results} == {"old code", "new code, second version"}
    after = [r for r in load.results if r.started > reloaded_at]
    assert after and {r.body for r in after} == {"new code, second version"}
    assert server.output().count("Hang up") == 2
    print(f"{load.count()} requests, 0 failed, {load.retries} retried on a kept-alive connection the server closed")


def test_a_hup_stops_old_workers_only_once_new_ones_are_ready_and_no_request_waits(gunicorn, site):
    server = gunicorn(workers=2, env={"PYTHONPATH": str(site), "DJANGO_SETTINGS_MODULE": "hup_settings"})
    old = server.worker_pids()
    load = Load(server.port, "/version", clients=4, max_requests=20_000).start()
    try:
        wait_for(lambda: load.count() >= 200, timeout=60, what="200 requests before the HUP")
        hup_at = time.monotonic()
        new = reload_and_wait(server, old)
        done_at = time.monotonic()
        wait_for(lambda: sum(r.started > done_at for r in load.results) >= 200, timeout=60,
                 what="200 requests after the reload")
    finally:
        load.stop()
    assert load.failures() == []
    during = [r for r in load.results if r.finished >= hup_at and r.started <= done_at]
    assert during and max(r.seconds for r in during) < 5, max(r.seconds for r in during)
    # Each old worker was told to stop only after one more new worker had said it was ready.
    lines = server.output().splitlines()
    ready = [i for i, line in enumerate(lines) for pid in new if f"Worker (pid:{pid}) is ready" in line]
    exiting = sorted(i for i, line in enumerate(lines) for pid in old if f"Worker exiting (pid: {pid})" in line)
    assert len(ready) == len(new) and len(exiting) == len(old), server.output()[-3000:]
    for count, line in enumerate(exiting, start=1):
        assert sum(i < line for i in ready) >= count, server.output()[-3000:]


def test_a_deploy_that_cannot_load_keeps_the_old_workers_serving_and_a_fixed_one_rolls_forward(gunicorn, site):
    # No recycling: an old worker recycled by max_requests (10,000 by default) after the aborted rollout is
    # replaced by one that cannot load the broken code (docs/serving.md: fix and HUP before that). A slow
    # machine's load reached it in CI, and nothing served.
    server = gunicorn(workers=2, env={"PYTHONPATH": str(site), "DJANGO_SETTINGS_MODULE": "hup_settings",
                                      "GUNICORN_MAX_REQUESTS": "10000000"})
    old = set(server.worker_pids())
    load = Load(server.port, "/version", clients=4, max_requests=50_000).start()
    try:
        wait_for(lambda: load.count() >= 200, timeout=60, what="200 requests before the broken deploy")
        (site / "hup_view.py").write_text('raise RuntimeError("broken deploy: cannot import")\n')
        server.signal(signal.SIGHUP)
        wait_for(lambda: "ROLLOUT ABORTED" in server.output(), timeout=90, what="the rollout aborted")
        broken_at = time.monotonic()
        wait_for(lambda: sum(r.started > broken_at for r in load.results) >= 200, timeout=60,
                 what="200 requests after the aborted rollout")
        assert server.proc.poll() is None
        try:
            wait_for(lambda: set(server.worker_pids()) == old, timeout=60, what="only the old workers left")
        except AssertionError:
            about_old = [line for line in server.output().splitlines() if any(str(pid) in line for pid in old)]
            raise AssertionError(f"workers {server.worker_pids()}, old {old}:\n" + "\n".join(about_old)
                                 + f"\n...\n{server.output()[-3000:]}") from None

        fixing_at = time.monotonic()
        (site / "hup_view.py").write_text(VIEW.format(text="fixed code"))
        reload_and_wait(server, old)
        fixed_at = time.monotonic()
        wait_for(lambda: sum(r.started > fixed_at for r in load.results) >= 200, timeout=60,
                 what="200 requests after the fixed deploy")
    finally:
        load.stop()
    failures = load.failures()
    assert failures == [], f"{len(failures)} of {load.count()} requests failed, e.g. {failures[:3]}"
    assert {r.body for r in load.results if r.started > fixed_at} == {"fixed code"}
    assert {r.body for r in load.results if r.started < fixing_at} == {"old code"}
    output = server.output()
    assert "broken deploy: cannot import" in output  # the worker's traceback, for the operator


def test_a_deploy_whose_settings_fail_the_system_checks_is_not_rolled_out(gunicorn, site):
    # A user trial: STREAMS["PARTITIONS"] = "not-a-number" rolled out ("Rollout complete"), /readyz 200.
    server = gunicorn(workers=2, env={"PYTHONPATH": str(site), "DJANGO_SETTINGS_MODULE": "hup_settings"})
    old = set(server.worker_pids())
    settings_file = site / "hup_settings.py"
    settings_file.write_text(settings_file.read_text() + 'STREAMS = {**STREAMS, "PARTITIONS": "not-a-number"}\n')
    server.signal(signal.SIGHUP)
    wait_for(lambda: "ROLLOUT ABORTED" in server.output(), timeout=90, what="the rollout aborted")
    assert "streams_app.E031" in server.output() and server.proc.poll() is None
    wait_for(lambda: set(server.worker_pids()) == old, timeout=60, what="only the old workers left")
    assert server.get("/version")[1] == "old code"


def test_a_deploy_whose_last_middleware_fails_every_request_is_not_rolled_out(gunicorn, site):
    # A user trial: the new worker's check (GET /healthz through the app) was answered by HealthCheckMiddleware,
    # which project/settings.py places near the top, before the middleware below it ran: a deploy adding one
    # that raises on every request was rolled out ("Rollout complete") and every page was a 500.
    server = gunicorn(workers=2, env={"PYTHONPATH": str(site), "DJANGO_SETTINGS_MODULE": "hup_settings"})
    old = set(server.worker_pids())
    (site / "broken_middleware.py").write_text(BROKEN_MIDDLEWARE)
    settings_file = site / "hup_settings.py"
    settings_file.write_text(settings_file.read_text() + 'MIDDLEWARE = [*MIDDLEWARE, "broken_middleware.Broken"]\n')
    server.signal(signal.SIGHUP)
    wait_for(lambda: "ROLLOUT ABORTED" in server.output() or "Rollout complete" in server.output(), timeout=90,
             what="the rollout's outcome")
    output = server.output()
    assert "ROLLOUT ABORTED" in output and "Rollout complete" not in output, output[-4000:]
    assert "broken middleware: every request fails" in output  # the worker's traceback, for the operator
    wait_for(lambda: set(server.worker_pids()) == old, timeout=60, what="only the old workers left")
    assert server.get("/version") == (200, "old code")
    assert server.get("/healthz")[0] == 200  # probes are still answered first, by the middleware
