"""max_requests recycling and rollouts on a real gunicorn master (issue 48, the user trial's findings): code
that cannot load on disk before any HUP, a rollout whose old workers went first, the log's worker counts and
retry delays, and no ResourceWarning at a worker's exit."""
import json
import os
import re
import signal
import time

import pytest

from tests.serving.hup_site import BROKEN_VIEW, VIEW, gated_view, site_env
from tests.serving.load import Load
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

MAX_REQUESTS = 200
NEXT_ATTEMPT = re.compile(r"Next attempt in (\d+) s")


def readyz(server):
    status, body = server.get("/readyz")
    return status, json.loads(body)


def requests_since(load, moment):
    return sum(r.started > moment for r in load.results)


def test_code_broken_on_disk_before_the_hup_never_stops_the_site_and_the_fixed_hup_serves_it(gunicorn, site):
    # The trial: a deploy wrote code that cannot load, its HUP not sent yet. Both workers reached max_requests
    # within a second, exited (gunicorn lets a worker decide that itself) and were replaced by workers that
    # could not boot: ~9 s with nothing serving, until the HUP of fixed code. Now a worker past max_requests
    # serves until its replacement is ready, and a replacement that cannot load holds recycling at once.
    server = gunicorn(workers=2, env=site_env(site, GUNICORN_MAX_REQUESTS=str(MAX_REQUESTS)))
    old = set(server.worker_pids())
    load = Load(server.port, "/version", clients=4, max_requests=1_000_000).start()
    try:
        wait_for(lambda: load.count() >= 50, timeout=60, what="50 requests before the broken deploy")
        (site / "hup_view.py").write_text(BROKEN_VIEW)
        broken_at = time.monotonic()
        target = 3 * (MAX_REQUESTS + MAX_REQUESTS // 10)  # three times max_requests and its jitter
        try:
            # Three failed replacements too: the retry delay doubles once per attempt, 1, 2, 4 s.
            wait_for(lambda: requests_since(load, broken_at) >= target
                     and len(NEXT_ATTEMPT.findall(server.output())) >= 3, timeout=120,
                     what=f"{target} requests and three failed replacements after the broken deploy")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {len(load.failures())} failed so far, e.g. {load.failures()[:3]}\n"
                                 + server.output()[-6000:]) from None
        output = server.output()
        assert "RECYCLING HELD" in output and "broken deploy: cannot import" in output, output[-4000:]
        # Past max_requests before the hold began, and told so when it did.
        assert "keeps serving with the code it loaded" in output, output[-4000:]
        assert "NO WORKER IS SERVING" not in output, output[-4000:]
        # No worker past max_requests left by itself (another of its threads once saw the old limit).
        assert "Autorestarting worker" not in output, output[-4000:]
        assert set(server.worker_pids()) >= old  # the old workers, with perhaps a replacement trying to boot
        assert [int(n) for n in NEXT_ATTEMPT.findall(output)][:3] == [1, 2, 4], output[-4000:]
        status, body = readyz(server)
        assert status == 200 and body["web_rollout"]["recycling"] == "held", body

        # A HUP of the still broken code is aborted; its failure starts the delays afresh (1 s, then 2 s), not
        # at what the earlier failures doubled them to.
        attempts = len(NEXT_ATTEMPT.findall(server.output()))
        server.signal(signal.SIGHUP)
        wait_for(lambda: "ROLLOUT ABORTED" in server.output(), timeout=90, what="the broken HUP aborted")
        wait_for(lambda: len(NEXT_ATTEMPT.findall(server.output())) > attempts, timeout=60,
                 what="a failed replacement after the aborted HUP")
        assert int(NEXT_ATTEMPT.findall(server.output())[attempts]) == 2, server.output()[-4000:]

        fixing_at = time.monotonic()
        (site / "hup_view.py").write_text(VIEW.format(text="fixed code"))
        hup_at, before = len(server.output()), set(server.worker_pids())
        server.signal(signal.SIGHUP)
        wait_for(lambda: "Rollout complete" in server.output()[hup_at:], timeout=90, what="the fixed HUP's rollout")
        # Stopped old workers answer their kept-alive connections for up to 2 s (gthread's linger) before they exit.
        wait_for(lambda: before.isdisjoint(server.worker_pids()), timeout=60, what="the old workers gone")
        fixed_at = time.monotonic()
        wait_for(lambda: requests_since(load, fixed_at) >= 200, timeout=60, what="200 requests after the fixed HUP")
    finally:
        load.stop()
    failures = load.failures()
    assert failures == [], f"{len(failures)} of {load.count()} requests failed, e.g. {failures[:3]}"
    assert {r.body for r in load.results if r.started < fixing_at} == {"old code"}
    assert {r.body for r in load.results if r.started > fixed_at} == {"fixed code"}
    assert readyz(server)[1]["web_rollout"]["recycling"] == "normal"


def test_a_rollout_completes_when_its_old_workers_went_before_the_new_ones_were_ready(gunicorn, site):
    # The trial: with the old workers gone before the new ones came up (recycled then, killed, crashed), no
    # "Rollout complete" was logged and recycling stayed held for good ("a rollout is under way").
    gate = site / "gate"
    server = gunicorn(workers=2, env=site_env(site))
    old = server.worker_pids()
    (site / "hup_view.py").write_text(gated_view(gate, "new code"))
    server.signal(signal.SIGHUP)
    wait_for(lambda: len(server.worker_pids()) == 4, timeout=60, what="two new workers loading")
    for pid in old:  # this test's gunicorn's workers
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not set(server.worker_pids()) & set(old), timeout=60, what="the old workers gone")
    gate.touch()
    wait_for(lambda: "Rollout complete" in server.output(), timeout=60,
             what="Rollout complete" + "\n" + server.output()[-3000:])
    assert "Rollout complete in" in server.output() and ": 2 workers run the new code" in server.output()
    assert server.get("/version") == (200, "new code")
    status, body = readyz(server)
    assert body["web_rollout"]["recycling"] == "normal", body


def test_the_rollout_log_counts_the_workers_that_serve(gunicorn, site):
    # The trial: a HUP while an earlier one's workers were still loading said "the 4 running now serve until
    # their replacements are ready": two of them served, the two still loading were stopped at once.
    gate = site / "gate"
    server = gunicorn(workers=2, env=site_env(site))
    (site / "hup_view.py").write_text(gated_view(gate, "new code"))
    server.signal(signal.SIGHUP)
    wait_for(lambda: len(server.worker_pids()) == 4, timeout=60, what="the first HUP's two workers loading")
    server.signal(signal.SIGHUP)
    wait_for(lambda: server.output().count("Rollout: starting") == 2, timeout=60, what="the second HUP's rollout")
    gate.touch()
    wait_for(lambda: "Rollout complete" in server.output(), timeout=90, what="Rollout complete")
    starts = re.findall(r"Rollout: starting (\d+) workers with the code on disk; the (\d+) serving now",
                        server.output())
    assert starts == [("2", "2"), ("2", "2")], server.output()[-4000:]
    assert re.findall(r"Rollout complete in [\d.]+ s: (\d+) workers", server.output()) == ["2"]

    # An aborted one: one ROLLOUT ABORTED naming the 2 workers that serve, and no "replacement worker failed"
    # for the other new worker that failed with it.
    (site / "hup_view.py").write_text(BROKEN_VIEW)
    server.signal(signal.SIGHUP)
    wait_for(lambda: "ROLLOUT ABORTED" in server.output(), timeout=90, what="the broken HUP aborted")
    wait_for(lambda: len(server.worker_pids()) == 2, timeout=60, what="the aborted rollout's workers gone")
    output = server.output()
    assert re.findall(r"The (\d+) workers already running keep serving", output) == ["2"], output[-4000:]
    assert "other workers keep serving" not in output and "NO WORKER IS SERVING" not in output, output[-4000:]


def test_a_worker_exits_without_a_resource_warning_about_the_registration_process(gunicorn, site):
    # The trial: every worker's exit printed "ResourceWarning: subprocess N is still running", N being the
    # master's registration process, whose Popen the worker had inherited.
    server = gunicorn(workers=2, env=site_env(site, PYTHONWARNINGS="default", GUNICORN_MAX_REQUESTS="20"))
    assert "Discovery registration started" in server.output()
    booted = server.booted()
    for _ in range(60):  # recycled workers exit
        assert server.get("/version")[0] == 200
    wait_for(lambda: server.booted() >= booted + 2 and server.ready() >= 4, timeout=60, what="recycled workers")
    server.stop()
    output = server.output()
    assert "Worker exiting" in output
    assert "ResourceWarning" not in output, output[-4000:]


def test_a_hup_is_not_aborted_by_a_worker_of_the_code_before_it_that_fails(gunicorn, site):
    # The bench run of the trial's scenario: a dead worker's replacement, forked before the HUP of fixed code and
    # still loading the broken code then, failed during the rollout and aborted it ("ROLLOUT ABORTED").
    gate = site / "gate"
    server = gunicorn(workers=2, env=site_env(site))
    (site / "hup_view.py").write_text(gated_view(gate))  # broken, once the gate opens
    gone = server.worker_pids()[0]
    os.kill(gone, signal.SIGTERM)  # this test's gunicorn's worker: the master forks a replacement
    wait_for(lambda: (site / "gate.waiting").exists(), timeout=60, what="a replacement importing the broken code")
    (site / "hup_view.py").write_text(VIEW.format(text="fixed code"))
    hup_at = len(server.output())
    server.signal(signal.SIGHUP)
    wait_for(lambda: "Rollout: starting" in server.output()[hup_at:], timeout=60, what="the rollout started")
    gate.touch()  # the replacement of before the HUP fails now, while the new workers load
    wait_for(lambda: re.search("ROLLOUT ABORTED|Rollout complete", server.output()[hup_at:]), timeout=90,
             what="the rollout's outcome")
    output = server.output()[hup_at:]
    assert "Rollout complete" in output and "ROLLOUT ABORTED" not in output, output[-4000:]
    assert "the 1 serving now" in output, output[-4000:]
    wait_for(lambda: server.get("/version") == (200, "fixed code"), timeout=30, what="the fixed code answering")
