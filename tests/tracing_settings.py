"""tests.tasks_settings with OpenTelemetry's SDK configured in settings, as docs/tracing.md shows, with an
exporter the tests can read: each process appends its finished spans to SHOAL_TEST_SPANS/spans-<pid>.jsonl
(tests/span_files.py). The consumers and the publishing command are tests/tracingapp's."""
import os

from tests.tasks_settings import *  # noqa: F401,F403
from tests.tasks_settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.tracingapp"]

if os.environ.get("SHOAL_TEST_SPANS"):
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from tests.span_files import JsonLinesExporter

    # SimpleSpanProcessor: each span is written when it ends, so a test reads it without waiting for a batch.
    _provider = TracerProvider(resource=Resource.create({"service.name": "shoal-tests"}))
    _provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["SHOAL_TEST_SPANS"])))
    trace.set_tracer_provider(_provider)
