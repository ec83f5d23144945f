"""/metrics under a real gunicorn whose workers are recycled every few requests (max_requests)."""
import os
import re

import pytest

from tests.waiting import wait_for

pytestmark = pytest.mark.slow

REQUESTS = re.compile(r"^django_http_requests_before_middlewares_total (\S+)$", re.M)


def requests_counted(server):
    status, body = server.get("/metrics")
    assert status == 200, body
    return float(REQUESTS.search(body).group(1))


def only_live_and_archive_files(server):
    live = {str(pid) for pid in server.worker_pids()}
    for name in os.listdir(server.metrics_dir):
        if not name.endswith(".db"):
            continue
        owner = name[:-3].rsplit("_", 1)[1]
        if owner != "archive" and owner not in live:
            return False
    return True


def test_counters_survive_worker_recycling_and_the_directory_stays_bounded(gunicorn):
    server = gunicorn(workers=2, args=["--max-requests", "10", "--max-requests-jitter", "0"])
    sent = requests_counted(server)  # start-up polled /healthz; this scrape counts itself too
    seen = []
    for _ in range(12):
        for _ in range(9):
            assert server.get("/healthz")[0] == 200
            sent += 1
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
    assert requests_counted(server) == sent + 1


def test_metrics_cover_every_worker_with_no_variable_preset(gunicorn):
    # As a user starts it: nothing in the environment says where the multiprocess files go.
    server = gunicorn(workers=2)
    assert "PROMETHEUS_MULTIPROC_DIR" not in server.env
    before = requests_counted(server)
    for _ in range(40):  # new connections: the kernel spreads them over both workers
        assert server.get("/healthz")[0] == 200
    # Every worker's requests, whichever worker takes the scrape (the scrape counts itself).
    assert requests_counted(server) == before + 40 + 1
    files = {name for name in os.listdir(server.metrics_dir) if name.endswith(".db")}
    assert {f"counter_{pid}.db" for pid in server.worker_pids()} <= files, files
