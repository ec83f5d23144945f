"""``manage.py traced_publish``: inside a span of its own (as a traced web request would be), publish to
the tracing tests' streams and enqueue a sync and an async task; print the span's trace and span ids."""
import json

from django.core.management.base import BaseCommand
from opentelemetry import trace

from streams_app import publish, publish_many


class Command(BaseCommand):
    help = "Publish and enqueue inside a span; print its trace id and span id as JSON."

    def add_arguments(self, parser):
        parser.add_argument("--outbox", action="store_true", help="Publish to 'traced' through the outbox instead.")

    def handle(self, *args, **options):
        from tests.testapp.tasks import add, async_add

        with trace.get_tracer("tests").start_as_current_span("request") as span:
            if options["outbox"]:
                publish("traced", {"via": "outbox"}, outbox=True)
            else:
                publish("traced", {"via": "publish"})
                publish_many("traced", [{"via": "publish_many", "n": n} for n in range(2)])
                publish("traced-async", {"via": "publish"})
                publish("traced-fail", {"via": "publish"})
                add.enqueue(2, 3)
                async_add.enqueue(4, 5)
        context = span.get_span_context()
        trace.get_tracer_provider().shutdown()
        self.stdout.write(json.dumps({"trace_id": f"0x{context.trace_id:032x}", "span_id": f"0x{context.span_id:016x}"}))
