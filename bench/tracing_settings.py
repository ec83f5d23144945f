"""bench/settings.py for bench/tracing.py's consumer, in one of three tracing modes (BENCH_OTEL):

none  opentelemetry cannot be imported (as if it were not installed: an import of it raises ImportError)
api   opentelemetry-api installed, no tracer provider set (no SDK configured): what Shoal costs a
      project that installed the extra and traces nothing
sdk   the SDK configured as docs/tracing.md shows, a BatchSpanProcessor in front of an exporter that
      drops every span: the spans' cost, without any exporter's
"""
import os
import sys

MODE = os.environ.get("BENCH_OTEL", "api")
if MODE == "none":
    sys.modules["opentelemetry"] = None  # before anything could import it

from bench.settings import *  # noqa: E402,F401,F403

if MODE == "sdk":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class DropSpans(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    _provider = TracerProvider()
    _provider.add_span_processor(BatchSpanProcessor(DropSpans()))
    trace.set_tracer_provider(_provider)
