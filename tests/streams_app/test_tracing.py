"""Tracing off costs nothing (streams_app/tracing.py): without opentelemetry nothing of it is imported, and
with the API but no tracer provider (no SDK configured) nothing is injected. The traces themselves, across
real processes: test_tracing_processes.py."""
import json
import subprocess
import sys

import pytest

from streams_app import publish, tracing
from tests.conftest import ROOT


def test_with_the_api_and_no_tracer_provider_a_publish_carries_no_trace_context(redis):
    pytest.importorskip("opentelemetry.trace", reason="needs opentelemetry-api (requirements/base.txt)")
    from opentelemetry import trace

    # This process never sets a provider (the SDK is configured only in the processes of the tracing tests).
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert not tracing.active()
    publish("untraced", {"n": 1}, headers={"h": 1})
    publish("untraced", {"n": 2})
    [(_, first), (_, second)] = redis.xrange("untraced")
    assert json.loads(first["headers"]) == {"h": 1}
    assert "headers" not in second


BLOCKED = """
import sys
sys.modules["opentelemetry"] = None  # as if the package were not installed: importing it raises ImportError
import django
django.setup()
from streams_app import publish, tracing
publish("untraced", {"n": 1})
assert not tracing.active()
assert tracing.for_consumer(5, lambda deliveries: 1.0, "{untraced}:dlq") is None
assert not [name for name in sys.modules if name.startswith("opentelemetry") and sys.modules[name] is not None]
print("ok")
"""


def test_without_opentelemetry_installed_nothing_of_it_is_imported_and_consumers_make_no_spans(redis_server):
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", BLOCKED], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert redis_server.client().xlen("untraced") == 1
