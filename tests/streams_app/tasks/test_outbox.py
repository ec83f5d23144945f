"""OPTIONS["OUTBOX"]: an enqueue in a transaction commits with it, through the transactional outbox."""
import pytest
from django.db import transaction

from streams_app.publishing.message import Message
from streams_app.outbox.models import OutboxMessage
from streams_app.outbox.relay import Relay
from streams_app.tasks.api import TaskResultDoesNotExist
from streams_app.tasks.runner import run_message
from tests import tasks_settings

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = {"OUTBOX_BATCH": 500, "OUTBOX_SWEEP_INTERVAL": 0.1, "OUTBOX_RETENTION": 3600}


@pytest.fixture
def outbox_backend(settings, tasks_backend):
    settings.TASKS = {"default": {**tasks_settings.TASKS["default"], "OPTIONS": {"OUTBOX": True}}}


@pytest.fixture
def relay():
    made = Relay("default", config=QUICK)
    yield made
    made.guard.release()


def test_an_enqueue_rolled_back_with_its_transaction_leaves_nothing(outbox_backend, jobs, redis):
    with pytest.raises(RuntimeError), transaction.atomic():
        result = jobs.add.enqueue(1, 2)
        raise RuntimeError("the order could not be saved")
    assert OutboxMessage.objects.count() == 0
    with pytest.raises(TaskResultDoesNotExist):
        jobs.add.get_result(result.id)
    assert not redis.exists("tasks:default")


def test_an_enqueue_commits_with_the_row_and_the_relay_publishes_it(outbox_backend, jobs, redis, relay):
    with transaction.atomic():
        result = jobs.add.enqueue(1, 2)
        assert OutboxMessage.objects.filter(relayed_at__isnull=True).count() == 1
        with pytest.raises(TaskResultDoesNotExist):  # its READY result is written with the commit
            jobs.add.get_result(result.id)
        assert not redis.exists("tasks:default")
    assert jobs.add.get_result(result.id).status == "READY"
    relay.tick()
    [(entry_id, fields)] = redis.xrange("tasks:default")
    assert fields["key"] == result.id
    run_message("default", Message(entry_id, "tasks:default", "workers", fields, consumer="worker-1"))
    done = jobs.add.get_result(result.id)
    assert done.status == "SUCCESSFUL" and done.return_value == 3 and done.worker_ids == ["worker-1"]


def test_a_high_priority_enqueue_goes_to_its_band_through_the_outbox_too(outbox_backend, jobs, redis, relay):
    with transaction.atomic():
        jobs.add.using(priority=10).enqueue(1, 2)
    relay.tick()
    assert redis.xlen("tasks:default:high") == 1


def test_task_enqueued_fires_only_when_the_transaction_commits(outbox_backend, jobs, redis):
    from streams_app.tasks.api import task_enqueued

    fired = []

    def receiver(sender, task_result, **kwargs):
        fired.append(task_result.id)

    task_enqueued.connect(receiver, weak=False)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            rolled_back = jobs.add.enqueue(1, 2)
            raise RuntimeError("the order could not be saved")
        with transaction.atomic():
            committed = jobs.add.enqueue(3, 4)
            assert fired == []  # not before the commit
        outside = jobs.add.enqueue(5, 6)  # autocommit: at once
    finally:
        task_enqueued.disconnect(receiver)
    assert rolled_back.id not in fired and fired == [committed.id, outside.id]
