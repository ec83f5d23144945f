"""shoal_tasks_enqueued/started/succeeded/failed_total per task and queue: counted where each happens,
served on the web tier's /metrics and on a consumer's --metrics-port."""
import signal
import urllib.request

import pytest
from django.db import transaction
from prometheus_client import REGISTRY

from streams_app.exceptions import RejectMessage
from streams_app.publishing.message import Message
from streams_app.tasks.runner import run_message
from tests import tasks_settings
from tests.redis_server import free_port
from tests.waiting import wait_for

ADD = {"task": "tests.testapp.tasks.add", "queue": "default"}
FAIL = {"task": "tests.testapp.tasks.fail", "queue": "default"}
EMAIL = {"task": "tests.testapp.tasks.send_email", "queue": "emails"}


def value(name, labels):
    return REGISTRY.get_sample_value(f"shoal_tasks_{name}_total", labels) or 0.0


def run_last(redis, stream="tasks:default"):
    entry_id, fields = redis.xrange(stream)[-1]
    run_message("default", Message(entry_id, stream, "workers", fields, deliveries=1, consumer="w"))


@pytest.mark.django_db
def test_each_step_of_a_task_is_counted_per_task_and_queue(jobs, redis, client):
    before = {(name, tuple(labels.values())): value(name, labels)
              for name in ("enqueued", "started", "succeeded", "failed") for labels in (ADD, FAIL, EMAIL)}

    def delta(name, labels):
        return value(name, labels) - before[(name, tuple(labels.values()))]

    jobs.add.enqueue(1, 2)
    run_last(redis)
    jobs.fail.enqueue("no")
    with pytest.raises(RejectMessage):
        run_last(redis)
    jobs.send_email.enqueue("a@example.com")
    assert [delta(n, ADD) for n in ("enqueued", "started", "succeeded", "failed")] == [1, 1, 1, 0]
    assert [delta(n, FAIL) for n in ("enqueued", "started", "succeeded", "failed")] == [1, 1, 0, 1]
    assert [delta(n, EMAIL) for n in ("enqueued", "started", "succeeded", "failed")] == [1, 0, 0, 0]
    text = client.get("/metrics").content.decode()
    assert 'shoal_tasks_enqueued_total{queue="emails",task="tests.testapp.tasks.send_email"}' in text


@pytest.mark.django_db
def test_a_retried_raise_is_an_attempt_not_a_failure(jobs, redis, settings):
    settings.TASKS = {"default": {**tasks_settings.TASKS["default"], "OPTIONS": {"MAX_RETRIES": 1}}}
    started, failed = value("started", FAIL), value("failed", FAIL)
    jobs.fail.enqueue("once")
    run_last(redis)  # READY again, its retry a deferred message
    assert (value("started", FAIL) - started, value("failed", FAIL) - failed) == (1, 0)


@pytest.mark.django_db(transaction=True)
def test_with_the_outbox_only_a_committed_enqueue_is_counted(jobs, settings, redis):
    settings.TASKS = {"default": {**tasks_settings.TASKS["default"], "OPTIONS": {"OUTBOX": True}}}
    before = value("enqueued", ADD)
    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.add.enqueue(1, 2)
        raise RuntimeError("rolled back")
    assert value("enqueued", ADD) == before
    with transaction.atomic():
        jobs.add.enqueue(1, 2)
        assert value("enqueued", ADD) == before  # not until the commit
    assert value("enqueued", ADD) == before + 1


@pytest.mark.slow
def test_a_consumer_serves_the_task_counters_of_its_workers(jobs, redis, run_workers):
    port = free_port()
    proc = run_workers("--workers", "2", "--metrics-port", str(port))
    for n in range(5):
        jobs.add.enqueue(n, n)
    jobs.fail.enqueue("no")

    def scrape():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        except OSError:
            return ""

    wait_for(lambda: 'shoal_tasks_succeeded_total{queue="default",task="tests.testapp.tasks.add"} 5.0' in scrape(),
             timeout=60, what="5 tasks counted SUCCESSFUL across the workers")
    wait_for(lambda: 'shoal_tasks_failed_total{queue="default",task="tests.testapp.tasks.fail"} 1.0' in scrape(),
             timeout=30, what="the failed task counted")
    assert 'shoal_tasks_started_total{queue="default",task="tests.testapp.tasks.add"} 5.0' in scrape()
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0


@pytest.mark.django_db
def test_a_refused_task_message_is_counted_by_backend_not_as_a_failure(jobs, redis):
    """The path of a refused message is whatever the message says: not a label, the backend alias is."""
    import json

    refused, failed = value("refused", {"backend": "default"}), value("failed", ADD)
    jobs.add.enqueue(1, 2)
    payload = json.loads(redis.xrange("tasks:default")[-1][1]["payload"])
    redis.xadd("tasks:default", {"payload": json.dumps({**payload, "task": "tests.testapp.tasks.nothing_here"})})
    with pytest.raises(RejectMessage):
        run_last(redis)
    assert value("refused", {"backend": "default"}) - refused == 1
    assert value("failed", ADD) - failed == 0
    assert REGISTRY.get_sample_value("shoal_tasks_refused_total", {"backend": "tests.testapp.tasks.nothing_here"}) is None
