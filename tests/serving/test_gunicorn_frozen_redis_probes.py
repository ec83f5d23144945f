"""A Redis that hangs (SIGSTOP: connections are accepted by the kernel, nothing answers) must not
hold the web tier's probes or scrapes for the shared connection's 30 s socket timeout."""
import json
import signal
import time

import pytest

from tests.serving.gunicorn_process import Gunicorn

pytestmark = pytest.mark.slow


def test_readyz_and_metrics_answer_quickly_while_redis_is_frozen(tmp_path, redis_factory):
    server = redis_factory()
    web = Gunicorn(tmp_path / "gunicorn", server.url, workers=1).start()
    try:
        assert web.get("/readyz")[0] == 200
        status, body = web.get("/metrics")
        assert status == 200 and "shoal_backlog_scrape_ok 1.0" in body
        server.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            status, body = web.get("/readyz", timeout=20)
            took = time.monotonic() - started
            assert status == 503 and took < 5, (status, took)
            checks = json.loads(body)["checks"]
            assert checks["redis"] in ("timed out", f"no answer within {1:g}s"), checks

            started = time.monotonic()
            status, body = web.get("/metrics", timeout=40)
            took = time.monotonic() - started
            assert status == 200 and took < 8, (status, took)
            assert "shoal_backlog_scrape_ok 0.0" in body
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert web.get("/readyz")[0] == 200
    finally:
        web.stop()
