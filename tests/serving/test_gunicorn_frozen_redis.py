"""A frozen Redis (SIGSTOP) does not starve gunicorn: admin pages answer within seconds, so /healthz does too.

Before the admin had its own short Redis timeout, each page held a thread for 30 s per Redis call,
and nine concurrent admin requests left /healthz waiting behind them until the probe failed.
"""
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection

import pytest

from tests.serving.gunicorn_process import ROOT, Gunicorn

pytestmark = pytest.mark.slow

BOUND = 10.0  # loose: the admin's timeout is 2 s; the pool's 30 s is what is ruled out

SESSION = """
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import Permission, User
from django.contrib.sessions.backends.db import SessionStore
user = User.objects.create_user("op", password="x", is_staff=True)
user.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
s = SessionStore()
s[SESSION_KEY], s[BACKEND_SESSION_KEY] = str(user.pk), "django.contrib.auth.backends.ModelBackend"
s[HASH_SESSION_KEY] = user.get_session_auth_hash()
s.save()
print("SESSION", s.session_key)
"""


def timed_get(port, path, cookie=""):
    started = time.monotonic()
    conn = HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path, headers={"Cookie": cookie} if cookie else {})
        status = conn.getresponse().status
    finally:
        conn.close()
    return status, time.monotonic() - started


def test_nine_admin_requests_on_a_frozen_redis_leave_healthz_answering(tmp_path, redis_factory):
    redis_server = redis_factory()
    server = Gunicorn(tmp_path / "web", redis_server.url, workers=2)
    server.metrics_dir.mkdir(parents=True, exist_ok=True)  # gunicorn.conf.py makes it for the workers
    (tmp_path / "web" / "var").mkdir(parents=True, exist_ok=True)
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=server.env, check=True, timeout=300)
    out = subprocess.run([*manage, "shell", "-c", SESSION], cwd=ROOT, env=server.env, check=True, timeout=120,
                         capture_output=True, text=True).stdout
    cookie = "sessionid=" + out.split("SESSION ")[1].split()[0]
    server.start()
    try:
        pages = ["/admin/", "/admin/streams_app/stream/", "/admin/streams_app/consumergroup/",
                 "/admin/streams_app/deadletter/"]
        for path in pages:  # connections to Redis are open when it freezes, as in production
            assert timed_get(server.port, path, cookie)[0] == 200, path
        redis_server.process.send_signal(signal.SIGSTOP)
        try:
            with ThreadPoolExecutor(10) as pool:
                admin = [pool.submit(timed_get, server.port, pages[n % len(pages)], cookie) for n in range(9)]
                time.sleep(0.2)  # the admin requests hold the threads first
                health = pool.submit(timed_get, server.port, "/healthz")
                status, took = health.result()
                assert status == 200 and took < BOUND, f"/healthz took {took:.1f} s"
                for future in admin:
                    status, took = future.result()
                    assert status == 200 and took < BOUND, f"an admin page took {took:.1f} s"
        finally:
            redis_server.process.send_signal(signal.SIGCONT)
    finally:
        server.stop()
