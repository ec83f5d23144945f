"""/metrics under a real gunicorn whose workers are recycled every few requests (max_requests)."""
import os
import re

import pytest

from tests.waiting import wait_for

pytestmark = pytest.mark.slow

REQUESTS = re.compile(r"^django_http_requests_before_middlewares_total (\S+)$", re.M)


def requests_counted(server):
    status, body = server.get("/metrics", timeout=60)
    assert status == 200, body
    return float(REQUESTS.search(body).group(1))


def without_probes(gunicorn, **kwargs):
    """A gunicorn whose registration process has made its last /readyz probe (they are requests too,
    counted like the test's own): it probes until a worker answers, then no more (WEB_HEALTH_CHECK=0)."""
    server = gunicorn(env={"WEB_HEALTH_CHECK": "0"}, **kwargs)
    wait_for(lambda: "a worker answers" in server.output(), timeout=60, what="the registration's last probe")
    return server


def only_live_and_archive_files(server):
    live = {str(pid) for pid in server.worker_pids()}
    for name in os.listdir(server.metrics_dir):
        if not name.endswith(".db"):
            continue
        owner = name[:-3].rsplit("_", 1)[1]
        if owner != "archive" and owner not in live:
            return False
    return True


def ready_workers(server):
    """Workers that said they are ready: each sent one request through the app first (its boot check)."""
    return server.output().count(") is ready (app loaded")


def every_booted_worker_ready(server):
    """Every worker booted is ready and no recycling is pending: a worker that reached max_requests said so
    while answering its last request, and serves on until the master has booted its replacement."""
    output = server.output()
    due = output.count("it serves until the master has its replacement ready")
    recycled = output.count("recycled after max_requests: worker")
    return ready_workers(server) == server.booted() and due == recycled and len(server.worker_pids()) == server.workers


def test_counters_survive_worker_recycling_and_the_directory_stays_bounded(gunicorn):
    server = without_probes(gunicorn, workers=2, args=["--max-requests", "10", "--max-requests-jitter", "0"])
    wait_for(lambda: every_booted_worker_ready(server), timeout=60, what="the workers ready")
    # Start-up polled /healthz, each worker checked the app with one request; this scrape counts itself too.
    sent, ready = requests_counted(server), ready_workers(server)
    seen = []
    for _ in range(12):
        for _ in range(9):
            # A worker past max_requests serves until its replacement is ready (one at a time).
            assert server.get("/healthz", timeout=60)[0] == 200
            sent += 1
        # A recycled worker's replacement sends its boot check's request before it says it is ready.
        wait_for(lambda: every_booted_worker_ready(server), timeout=60, what="the new workers ready")
        sent, ready = sent + ready_workers(server) - ready, ready_workers(server)
        seen.append(requests_counted(server))
        sent += 1  # the scrape is counted before it collects
        # Every request ever answered is counted exactly once, whichever worker (alive or not) took it.
        assert seen[-1] == sent
    assert seen == sorted(seen)
    wait_for(lambda: server.booted() >= 2 + 8, timeout=30, what="workers recycled by max_requests")
    wait_for(lambda: only_live_and_archive_files(server), timeout=30, what="dead workers' files compacted")
    files = [name for name in os.listdir(server.metrics_dir) if name.endswith(".db")]
    assert "counter_archive.db" in files  # dead workers' counts live on there
    per_worker = {name.rsplit("_", 1)[0] for name in files}
    assert len(files) <= len(per_worker) * (server.workers + 1), files
    wait_for(lambda: every_booted_worker_ready(server), timeout=60, what="the new workers ready")
    assert requests_counted(server) == sent + 1 + ready_workers(server) - ready


def test_metrics_cover_every_worker_with_no_variable_preset(gunicorn):
    # As a user starts it: nothing in the environment says where the multiprocess files go.
    server = without_probes(gunicorn, workers=2)
    assert "PROMETHEUS_MULTIPROC_DIR" not in server.env
    # Each worker's boot check is a request too: counted once both said they are ready (a clean-clone
    # run read the count while the second still booted, and counted its check as one of the test's).
    wait_for(lambda: ready_workers(server) >= 2 and every_booted_worker_ready(server), timeout=60,
             what="both workers ready")
    before = requests_counted(server)
    for _ in range(40):  # new connections: the kernel spreads them over both workers
        assert server.get("/healthz")[0] == 200
    # Every worker's requests, whichever worker takes the scrape (the scrape counts itself).
    assert requests_counted(server) == before + 40 + 1
    files = {name for name in os.listdir(server.metrics_dir) if name.endswith(".db")}
    assert {f"counter_{pid}.db" for pid in server.worker_pids()} <= files, files


WORKER_SERIES = re.compile(r'^shoal_web_worker_(\w+)\{([^}]*)\} (\S+)$', re.M)


def worker_series(server):
    status, body = server.get("/metrics", timeout=60)
    assert status == 200, body
    return [(name, labels, float(value)) for name, labels, value in WORKER_SERIES.findall(body)]


def test_per_worker_memory_and_uptime_with_a_label_set_that_stays_bounded(gunicorn):
    server = gunicorn(workers=2, args=["--max-requests", "10", "--max-requests-jitter", "0"])

    def pids_shown():
        return {int(value) for name, _, value in worker_series(server) if name == "pid"}

    wait_for(lambda: pids_shown() == set(server.worker_pids()), timeout=30, what="a pid series per live worker")
    series = worker_series(server)
    memory = {labels: value for name, labels, value in series if name == "resident_memory_bytes"}
    assert set(memory) == {'worker="0"', 'worker="1"'} and min(memory.values()) > 10_000_000, memory
    assert all(value >= 0 for name, _, value in series if name == "uptime_seconds")
    # Workers recycled again and again: the slots are reused, so the label values stay few.
    seen = set()
    for _ in range(8):
        for _ in range(9):
            assert server.get("/healthz", timeout=60)[0] == 200
        # The master replaces one worker past max_requests at a time, each once its replacement is ready.
        wait_for(lambda: every_booted_worker_ready(server), timeout=60, what="the recycled workers replaced")
        seen |= {labels for _, labels, _ in worker_series(server)}
    assert server.booted() >= 2 + 4
    assert seen <= {f'worker="{slot}"' for slot in range(4)}, seen  # at most 2 × workers
    assert all("pid=" not in labels for labels in seen)
