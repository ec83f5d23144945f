"""Probes, 404s and scanners' bad Host headers leave gunicorn's log quiet."""
import http.client

import pytest

from tests.redis_server import free_port


def request(port, path, host="127.0.0.1"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.mark.slow
def test_probes_404s_and_bad_hosts_log_nothing(gunicorn):
    # Redis is down for this web tier: /readyz answers 503, as it would during an outage.
    web = gunicorn(workers=1, env={"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    before = len(web.lines)
    assert [request(web.port, "/readyz") for _ in range(5)] == [503] * 5
    assert request(web.port, "/no/such/page/") == 404
    assert request(web.port, "/admin/", host="scanner.example") == 400
    assert request(web.port, "/healthz") == 200
    logged = "".join(web.lines[before:])
    assert "django.request" not in logged and "DisallowedHost" not in logged, logged
    assert "Traceback" not in logged, logged
