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


VALID = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


@pytest.mark.parametrize("headers, parent", [
    ({"traceparent": 123}, False), ({"traceparent": True}, False), ({"traceparent": [5]}, False),
    ({"baggage": 7}, False), ({"traceparent": "garbage"}, False), ("not a dict", False),
    ({"traceparent": VALID, "tracestate": 5}, True),  # the bad tracestate is left out, the parent kept
])
def test_trace_headers_no_propagator_can_read_are_no_parent_never_a_failure(headers, parent):
    """A user trial: {"traceparent": 123} from a hand-written XADD failed the message before its handler ran,
    only because tracing was on (the propagators raise on values that are not text)."""
    import opentelemetry
    from opentelemetry import trace

    found = tracing._extracted(opentelemetry, headers)
    assert (found is not None and trace.get_current_span(found).get_span_context().is_valid) is parent


def test_a_valid_traceparent_is_the_parent():
    import opentelemetry
    from opentelemetry import trace

    found = tracing._extracted(opentelemetry, {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "n": 1})
    assert trace.get_current_span(found).get_span_context().trace_id == int("a" * 32, 16)
