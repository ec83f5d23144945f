"""A task enqueued inside capture_publishes (streams_app.testing) is recorded as the message its queue's stream
would hold, and nothing reaches Redis: the test settings point Redis at 127.0.0.1:1, where nothing listens."""
import pytest
import redis
from django.db import transaction

from streams_app.testing import capture_publishes


def test_an_enqueue_outside_a_capture_goes_to_redis_which_is_absent_here(jobs):
    with pytest.raises(redis.ConnectionError):
        jobs.add.enqueue(1, 2)


def test_an_enqueued_task_is_captured_with_no_redis(jobs):
    with capture_publishes() as published:
        result = jobs.add.enqueue(2, 3)
        jobs.send_email.enqueue("a@example.com", subject="hi")
    assert published.streams == ["tasks:default", "tasks:emails"]
    [message] = published.on("tasks:default")
    assert message.key == result.id
    assert message.payload["task"] == "tests.testapp.tasks.add"
    assert message.payload["args"] == [2, 3]
    assert published.on("tasks:emails")[0].payload["kwargs"] == {"subject": "hi"}


@pytest.mark.django_db(transaction=True)
def test_an_outbox_enqueue_is_captured_only_when_its_transaction_commits(jobs, settings):
    settings.TASKS = {"default": {**settings.TASKS["default"], "OPTIONS": {"OUTBOX": True}}}
    with capture_publishes() as published:
        with pytest.raises(RuntimeError), transaction.atomic():
            jobs.add.enqueue(1, 1)
            raise RuntimeError("rolled back")
        with transaction.atomic():
            jobs.add.enqueue(4, 4)
            assert published.streams == []
    assert [m.payload["args"] for m in published.on("tasks:default")] == [[4, 4]]
