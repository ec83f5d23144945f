"""Issue 46's "done when": a fresh ``django-admin startproject`` with the wheel installed as ``django-shoal[otel]``
and opentelemetry-sdk configured in its settings (docs/tracing.md), with an exporter that writes each span
as a JSON line to a file per process. A publish and an enqueue inside a span continue that trace in
``runconsumer``'s sync, async and task handlers, and a handler that raises ends its span in ERROR.

The version matrix (noxfile.py) runs it on each supported Django (``install``), Django 6.1 among them.
"""
import json
import signal
import subprocess
import sys
from pathlib import Path

import django
import pytest

from tests.host_project import build_wheel, host_env, make_host_project, run
from tests.redis_server import RedisServer
from tests.waiting import wait_for

pytestmark = pytest.mark.install

SETTINGS = '''
TASKS = {"default": {"BACKEND": "streams_app.tasks.StreamsBackend", "QUEUES": ["default"]}}
STREAMS = {"BLOCK_MS": 200}

# OpenTelemetry as docs/tracing.md shows, with an exporter this test reads in place of OTLP's.
import json as _json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class _SpanFiles(SpanExporter):
    def export(self, spans):
        with open(os.path.join(os.environ["SHOP_OUT"], f"spans-{os.getpid()}.jsonl"), "a") as out:
            for span in spans:
                out.write(span.to_json(indent=None) + "\\n")
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(_SpanFiles()))
trace.set_tracer_provider(_provider)
'''

CONSUMERS = '''
from streams_app import consumer


@consumer("traced", group="sync")
def handle(message):
    pass


@consumer("traced-async", group="async")
async def handle_async(message):
    pass


@consumer("traced-fail", group="g", max_deliveries=1)
def fails(message):
    raise ValueError("the handler raised")
'''

TASKS = '''
try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task


@task()
def add(a, b):
    return a + b


@task()
async def async_add(a, b):
    return a + b
'''

# Run inside the host project: publish and enqueue inside a span, as a traced request would.
PUBLISH = '''
import json, os
import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "host.settings")
django.setup()
from opentelemetry import trace
from streams_app import publish
from shop.tasks import add, async_add

with trace.get_tracer("host").start_as_current_span("request") as span:
    publish("traced", {"n": 1})
    publish("traced-async", {"n": 2})
    publish("traced-fail", {"n": 3})
    add.enqueue(2, 3)
    async_add.enqueue(4, 5)
print(json.dumps({"trace_id": f"0x{span.get_span_context().trace_id:032x}"}))
'''


def read_spans(out):
    spans = []
    for path in sorted(Path(out).glob("spans-*.jsonl")):
        spans += [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return spans


@pytest.mark.timeout(900)
def test_a_fresh_project_with_the_sdk_in_settings_traces_publish_and_enqueue_into_runconsumer(tmp_path):
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    out = tmp_path / "out"
    out.mkdir()
    env = host_env(venv, "redis://unused", out)
    run([python, "-m", "pip", "install", "--quiet", f"{wheel}[otel,tasks]", "opentelemetry-sdk==1.45.2",  # requirements/base.txt's pin
         f"Django=={django.get_version()}"], cwd=tmp_path, env=env)

    server = RedisServer(tmp_path / "redis").start()
    try:
        env = host_env(venv, server.url, out)
        site = tmp_path / "site"
        site.mkdir()
        make_host_project(site, venv, env)
        (site / "shop" / "consumers.py").write_text(CONSUMERS)
        (site / "shop" / "tasks.py").write_text(TASKS)
        with open(site / "host" / "settings.py", "a") as f:
            f.write(SETTINGS)
        run([python, "manage.py", "migrate", "--verbosity", "0"], cwd=site, env=env)
        consumer = subprocess.Popen([python, "manage.py", "runconsumer", "--workers", "2"], cwd=site, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            # The groups exist once the workers started: the messages published next are theirs.
            wait_for(lambda: all(server.client().exists(stream) and server.client().xinfo_groups(stream)
                                 for stream in ("traced", "traced-async", "traced-fail", "tasks:default",
                                                "tasks:default:async")) or consumer.poll() is not None,
                     timeout=120, what="the consumers' groups")
            assert consumer.poll() is None, consumer.stdout.read()
            request = json.loads(run([python, "-c", PUBLISH], cwd=site, env=env).strip().splitlines()[-1])

            def consumed():
                spans = read_spans(out)
                names = {s["name"] for s in spans if s["kind"] == "SpanKind.CONSUMER"}
                wanted = {"process traced", "process traced-async", "process traced-fail", "process tasks:default",
                          "process tasks:default:async"}
                return spans if wanted <= names else None

            spans = wait_for(lambda: consumed() or (consumer.poll() is not None and []), timeout=120,
                             what="the consumer spans of every handler")
            assert consumer.poll() is None, consumer.stdout.read()
        finally:
            consumer.send_signal(signal.SIGTERM)
            output, _ = consumer.communicate(timeout=120)
        assert consumer.returncode == 0, output
    finally:
        server.stop()

    producers = {s["context"]["span_id"]: s for s in spans if s["kind"] == "SpanKind.PRODUCER"}
    assert {s["name"] for s in producers.values()} == {
        "publish traced", "publish traced-async", "publish traced-fail", "publish tasks:default",
        "publish tasks:default:async"}
    for span in (s for s in spans if s["kind"] == "SpanKind.CONSUMER"):
        stream = span["name"].removeprefix("process ")
        assert span["context"]["trace_id"] == request["trace_id"], span
        assert producers[span["parent_id"]]["name"] == f"publish {stream}"  # a child of its publish
        assert span["attributes"]["messaging.destination.name"] == stream
        assert span["attributes"]["messaging.system"] == "redis"
        assert span["status"]["status_code"] == ("ERROR" if stream == "traced-fail" else "UNSET"), span
    [task] = [s for s in spans if s["name"] == "process tasks:default"]
    assert task["attributes"]["shoal.task.name"] == "shop.tasks.add"
