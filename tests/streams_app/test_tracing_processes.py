"""OpenTelemetry traces from a publishing process to real ``runconsumer`` processes (issue 46, docs/tracing.md).

Every process runs tests.tracing_settings: the SDK configured in settings, each process writing its spans
to a file of its own that the test reads (tests/span_files.py). The publisher is ``manage.py traced_publish``
(tests/tracingapp), which publishes and enqueues inside a span of its own, as a traced request would.
"""
import json
import subprocess
import sys

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the tracing tests need opentelemetry-sdk (requirements/base.txt)")

from tests.conftest import ROOT  # noqa: E402
from tests.span_files import read_spans  # noqa: E402
from tests.waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.slow

SETTINGS = "tests.tracing_settings"
FAST = {"BLOCK_MS": 200, "OUTBOX_SWEEP_INTERVAL": 0.3}
CONSUMERS = ["traced:sync", "traced-async:async", "traced-fail:g", "tasks:default:workers",
             "tasks:default:async:workers"]


def manage(server, spans, *args, database=None):
    """``manage.py ARGS`` to completion, with the tracing settings; its output."""
    env = {"DJANGO_SETTINGS_MODULE": SETTINGS, "REDIS_URL": server.url, "SHOAL_TEST_SPANS": str(spans),
           "SHOAL_TEST_STREAMS": json.dumps(FAST), "PATH": "/usr/bin:/bin",
           **({"DATABASE_URL": database.url} if database is not None else {})}
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def traced_consumer(run_consumer, tmp_path):
    spans = tmp_path / "spans"

    def start(*selectors, env=None):
        proc = run_consumer(*selectors, streams=FAST, env={"DJANGO_SETTINGS_MODULE": SETTINGS,
                                                           "SHOAL_TEST_SPANS": str(spans), **(env or {})})
        proc.wait_for_output("started", timeout=60)
        return proc

    start.spans = spans
    return start


def spans_named(spans, name, kind):
    return [span for span in read_spans(spans) if span["name"] == name and span["kind"] == f"SpanKind.{kind}"]


def wait_spans(spans, name, kind, count):
    return wait_for(lambda: (found := spans_named(spans, name, kind)) and len(found) >= count and found,
                    timeout=60, what=f"{count} {kind} span(s) {name!r}")


def event_names(span):
    return [event["name"] for event in span["events"]]


def test_a_publish_and_an_enqueue_in_a_span_continue_its_trace_in_sync_async_and_task_handlers(traced_consumer,
                                                                                              redis_server):
    consumer = traced_consumer(*CONSUMERS)
    spans = traced_consumer.spans
    request = json.loads(manage(redis_server, spans, "traced_publish").strip().splitlines()[-1])

    producers = {}
    for span in spans_named(spans, "publish traced", "PRODUCER") + spans_named(spans, "publish traced-async", "PRODUCER") \
            + spans_named(spans, "publish traced-fail", "PRODUCER") + spans_named(spans, "publish tasks:default", "PRODUCER") \
            + spans_named(spans, "publish tasks:default:async", "PRODUCER"):
        assert span["context"]["trace_id"] == request["trace_id"]
        assert span["parent_id"] == request["span_id"]  # the producer span is a child of the caller's span
        assert span["attributes"]["messaging.system"] == "redis"
        assert span["attributes"]["messaging.operation.type"] == "send"
        producers[span["context"]["span_id"]] = span
    assert len(producers) == 6  # publish, publish_many, async, failing, two enqueues
    many = [s for s in producers.values() if s["attributes"].get("messaging.batch.message_count") == 2]
    assert len(many) == 1

    def check_consumer(span, stream, group):
        assert span["context"]["trace_id"] == request["trace_id"]
        producer = producers[span["parent_id"]]  # a child of the PRODUCER span of its publish
        assert producer["attributes"]["messaging.destination.name"] == stream
        attributes = span["attributes"]
        assert attributes["messaging.system"] == "redis"
        assert attributes["messaging.destination.name"] == stream
        assert attributes["messaging.operation.type"] == "process"
        assert attributes["messaging.consumer.group.name"] == group
        assert attributes["shoal.delivery_count"] >= 1
        assert attributes["messaging.message.id"]
        return producer

    sync = wait_spans(spans, "process traced", "CONSUMER", 3)
    for span in sync:
        check_consumer(span, "traced", "sync")
        assert span["status"]["status_code"] == "UNSET"
    single = [producers[s["parent_id"]] for s in sync if "messaging.message.id" in producers[s["parent_id"]]["attributes"]]
    assert [p["attributes"]["messaging.message.id"] for p in single] == [
        s["attributes"]["messaging.message.id"] for s in sync if producers[s["parent_id"]] in single]
    [async_span] = wait_spans(spans, "process traced-async", "CONSUMER", 1)
    check_consumer(async_span, "traced-async", "async")

    [task] = wait_spans(spans, "process tasks:default", "CONSUMER", 1)
    producer = check_consumer(task, "tasks:default", "workers")
    assert task["attributes"]["shoal.task.name"] == "tests.testapp.tasks.add"
    assert task["attributes"]["shoal.task.result_id"] == producer["attributes"]["shoal.task.result_id"]
    [async_task] = wait_spans(spans, "process tasks:default:async", "CONSUMER", 1)
    producer = check_consumer(async_task, "tasks:default:async", "workers")
    assert async_task["attributes"]["shoal.task.name"] == "tests.testapp.tasks.async_add"
    assert async_task["attributes"]["shoal.task.result_id"] == producer["attributes"]["shoal.task.result_id"]

    failing = sorted(wait_spans(spans, "process traced-fail", "CONSUMER", 2),
                     key=lambda s: s["attributes"]["shoal.delivery_count"])
    for span, then in zip(failing, ["shoal.retry", "shoal.dead_letter"]):
        check_consumer(span, "traced-fail", "g")
        assert span["status"]["status_code"] == "ERROR"
        assert "ValueError: traced failure" in span["status"]["description"]
        [exception] = [e for e in span["events"] if e["name"] == "exception"]
        assert exception["attributes"]["exception.type"] == "ValueError"
        assert event_names(span)[-1] == then
    assert failing[1]["events"][-1]["attributes"]["shoal.dead_letter.stream"] == "{traced-fail}:dlq"
    original = failing[0]["parent_id"]

    # Replayed, the dead letter runs in a trace of its own, linked to the one it failed in.
    manage(redis_server, spans, "replay", "traced-fail", "--group", "g", "--all")
    replayed = wait_for(lambda: [s for s in spans_named(spans, "process traced-fail", "CONSUMER") if s["links"]],
                        timeout=60, what="the replayed dead letter's span")[0]
    assert replayed["context"]["trace_id"] != request["trace_id"]
    assert replayed["parent_id"] is None
    [link] = replayed["links"]
    assert link["context"]["trace_id"] == request["trace_id"] and link["context"]["span_id"] == original
    assert consumer.proc.poll() is None


def test_an_outbox_publish_keeps_the_context_of_its_publish_call_not_the_relays(traced_consumer, redis_server,
                                                                                _databases):
    database = _databases("sqlite")
    database.empty()
    traced_consumer("traced:sync", env={"DATABASE_URL": database.url})
    spans = traced_consumer.spans
    request = json.loads(manage(redis_server, spans, "traced_publish", "--outbox", database=database).splitlines()[-1])
    [producer] = spans_named(spans, "publish traced", "PRODUCER")
    assert producer["attributes"]["shoal.outbox"] is True
    assert redis_server.client().xlen("traced") == 0  # still in the outbox
    manage(redis_server, spans, "runrelay", "--once", database=database)
    [span] = wait_spans(spans, "process traced", "CONSUMER", 1)
    assert span["context"]["trace_id"] == request["trace_id"]
    assert span["parent_id"] == producer["context"]["span_id"]


def test_an_entry_taken_over_from_a_killed_consumer_runs_in_a_span_with_a_takeover_event(traced_consumer,
                                                                                         redis_server, tmp_path):
    marker = tmp_path / "first-delivery"
    fast = {"PENDING_TIMEOUT_MS": 1500, "CLAIM_INTERVAL_MS": 300}
    env = {"SHOAL_TEST_MARKER": str(marker), "SHOAL_TEST_STREAMS": json.dumps({**FAST, **fast})}
    first = traced_consumer("traced-slow:g", env=env)
    redis_server.client().xadd("traced-slow", {"payload": "{}"})
    wait_for(marker.exists, timeout=60, what="the first delivery running")
    first.kill()
    second = traced_consumer("traced-slow:g", env=env)
    try:
        [span] = wait_spans(traced_consumer.spans, "process traced-slow", "CONSUMER", 1)
    except AssertionError:
        raise AssertionError(second.output()) from None
    assert span["attributes"]["messaging.message.id"] == marker.read_text()
    assert "shoal.takeover" in event_names(span)
