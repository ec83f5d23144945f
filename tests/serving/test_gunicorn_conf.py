"""gunicorn.conf.py loads, and runs its master-side hooks, without importing Django or Redis.

Whatever the master imports, the workers it forks after a HUP inherit unreloaded; the reload test
proves new code is served, this one pins down why it can be.
"""
import json
import subprocess
import sys

from tests.serving.gunicorn_process import ROOT

PROBE = """
import json, os, runpy, sys, types
conf = runpy.run_path("gunicorn.conf.py")
from gunicorn.arbiter import Arbiter
server = Arbiter.__new__(Arbiter)  # what gunicorn passes, without starting it
server.log = types.SimpleNamespace(info=print)
conf["on_starting"](server)
assert type(server).__name__ == "ShoalArbiter"
conf["child_exit"](server, types.SimpleNamespace(pid=12345))
conf["post_fork"](server, types.SimpleNamespace(init_process=None))
print(json.dumps({"workers": conf["workers"], "threads": conf["threads"], "preload_app": conf["preload_app"],
                  "graceful_timeout": conf["graceful_timeout"], "max_requests": conf["max_requests"],
                  "jitter": conf["max_requests_jitter"], "pidfile": conf["pidfile"],
                  "metrics": os.environ["PROMETHEUS_MULTIPROC_DIR"],
                  "imported": sorted(m for m in sys.modules if m.split(".")[0] in ("django", "redis", "django_redis", "project", "shoal_common", "streams_app", "discovery_app"))}))
"""


def test_the_master_side_of_the_config_imports_no_app_code(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "SHOAL_VAR_DIR": str(tmp_path), "WEB_CONCURRENCY": "3"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    conf = json.loads(out.stdout.strip().splitlines()[-1])
    # project.devenv reads var/env (no Django); the rest is the packaged config's.
    assert conf["imported"] == ["project", "project.devenv", "shoal_common", "shoal_common.cpus",
                                "shoal_common.web_recycling", "shoal_common.web_rollout", "shoal_common.web_supervision",
                                "streams_app",
                                "streams_app.metrics", "streams_app.metrics.multiprocess", "streams_app.web", "streams_app.web.gunicorn_conf"]
    assert conf["workers"] == 3 and conf["threads"] == 4
    assert conf["preload_app"] is False and conf["graceful_timeout"] == 30
    assert conf["max_requests"] > 0 and 0 < conf["jitter"] < conf["max_requests"]
    assert conf["pidfile"] == str(tmp_path / "gunicorn.pid")
    assert conf["metrics"] == str(tmp_path / "prometheus")


def test_the_advertised_address_is_never_loopback_for_a_bind_to_every_interface():
    from shoal_common.web_supervision import advertised_address

    def debian_style():
        return "127.0.1.1"  # what gethostbyname(hostname) gives there

    assert advertised_address("0.0.0.0", {}, debian_style)[0] is None
    assert "WEB_ADVERTISE_ADDRESS" in advertised_address("0.0.0.0", {}, debian_style)[1]
    assert advertised_address("0.0.0.0", {}, lambda: None)[0] is None
    assert advertised_address("0.0.0.0", {}, lambda: "10.1.2.3")[0] == "10.1.2.3"
    assert advertised_address("::", {"WEB_ADVERTISE_ADDRESS": "orders.internal"}, debian_style)[0] == "orders.internal"
    assert advertised_address("127.0.0.1", {}, debian_style)[0] == "127.0.0.1"  # a loopback bind: loopback is right
