"""streams_app.tasks.cancel (issue 45): a queued task that will never run, on any worker, even one that
already read its message; ``manage.py canceltask``. The control room's Cancel: tests/streams_app/admin/test_tasks.py."""
import datetime as dt
import io

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.utils import timezone

from streams_app.consuming.chunks import run_chunk
from streams_app.publishing.message import Message
from streams_app.tasks import cancel, results
from streams_app.tasks.exceptions import TaskCancelled
from streams_app.tasks.awaiting import run_message_async
from streams_app.tasks.runner import QueueHandler, run_message
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db


def read(redis, stream="tasks:default", consumer="worker-1"):
    """The messages of ``stream`` as a worker that read them holds them."""
    return [Message(entry_id, stream, "workers", fields, deliveries=1, consumer=consumer)
            for entry_id, fields in redis.xrange(stream)]


def assert_cancelled(task, result_id):
    stored = task.get_result(result_id)
    assert (stored.status, stored.attempts, stored.worker_ids) == ("FAILED", 0, [])
    assert stored.is_finished and stored.finished_at is not None
    [error] = stored.errors
    assert error.exception_class is TaskCancelled and "it was not run" in error.traceback


def test_a_queued_task_cancelled_after_a_worker_read_it_is_acked_unrun(jobs, redis, tmp_path):
    marker = tmp_path / "ran"
    result = jobs.note.enqueue(str(marker), "x")
    [message] = read(redis)  # the worker already holds the message
    assert cancel(result.id) is True
    assert run_message("default", message) is None  # returns: the consumer acks it, not dead-lettered
    assert not marker.exists()
    assert_cancelled(jobs.note, result.id)


def test_cancelling_twice_is_safe_and_running_finished_or_unknown_tasks_are_not_cancelled(jobs, redis):
    queued, done, running = jobs.add.enqueue(1, 1), jobs.add.enqueue(2, 2), jobs.add.enqueue(3, 3)
    run_message("default", read(redis)[1])
    results.started(redis, running.id, "worker-9", 60)
    assert cancel(queued.id) is True and cancel(queued.id) is True  # it stays cancelled: one error, not two
    assert len(jobs.add.get_result(queued.id).errors) == 1
    assert cancel(done.id) is False and jobs.add.get_result(done.id).status == "SUCCESSFUL"
    assert cancel(running.id) is False and jobs.add.get_result(running.id).status == "RUNNING"
    assert cancel("0" * 32) is False and cancel("not an id!") is False and cancel(None) is False


def test_a_cancelled_task_in_a_batched_chunk_is_skipped_and_the_rest_run(jobs, redis):
    """begin_chunk starts a chunk's quick tasks in one script: it must not start a cancelled one."""
    first, second, third = (jobs.add.enqueue(n, n) for n in range(3))
    handler = QueueHandler("default")
    handler.timed(jobs.add.module_path, 0.001)
    cancel(second.id)
    outcome = run_chunk(handler, read(redis))
    assert len(outcome.acked) == 3 and not outcome.failed
    assert [jobs.add.get_result(r.id).status for r in (first, third)] == ["SUCCESSFUL", "SUCCESSFUL"]
    assert_cancelled(jobs.add, second.id)


def test_a_task_cancelled_between_two_tasks_of_a_thread_is_not_started_by_the_previous_ones_write(jobs, redis):
    """The per-task path writes a success with the next task's start (task_next.lua)."""
    first, second = jobs.add.enqueue(1, 1), jobs.add.enqueue(2, 2)
    handler = QueueHandler("default")  # never timed: task by task
    messages = read(redis)
    handler(messages[0])
    cancel(second.id)
    assert handler(messages[1]) is None
    assert handler.end_chunk() == []
    assert jobs.add.get_result(first.id).status == "SUCCESSFUL"
    assert_cancelled(jobs.add, second.id)


def test_an_async_task_cancelled_is_not_awaited(jobs, redis):
    result = jobs.async_add.enqueue(1, 2)
    [message] = read(redis, "tasks:default:async")
    cancel(result.id)
    assert async_to_sync(run_message_async)("default", message) is None
    assert_cancelled(jobs.async_add, result.id)


def test_a_deferred_task_cancelled_never_runs_when_it_comes_due(jobs, run_workers, redis, tmp_path):
    marker = tmp_path / "ran"
    later = jobs.note.using(run_after=timezone.now() + dt.timedelta(seconds=2)).enqueue(str(marker), "late")
    control = jobs.note.using(run_after=timezone.now() + dt.timedelta(seconds=2)).enqueue(str(tmp_path / "ok"), "ok")
    assert cancel(later.id) is True
    run_workers("tasks:default:workers")
    wait_for(lambda: jobs.note.get_result(control.id).is_finished, timeout=60, what="the control task ran")
    wait_for(lambda: redis.xinfo_groups("tasks:default")[0]["pending"] == 0
             and redis.xinfo_groups("tasks:default")[0]["entries-read"] == 2, timeout=30,
             what="both deferred messages read and acked")
    assert not marker.exists() and not redis.exists("{tasks:default}:dlq")
    assert_cancelled(jobs.note, later.id)


def test_canceltask_cancels_and_says_what_it_could_not(jobs, redis):
    queued, done = jobs.add.enqueue(1, 1), jobs.add.enqueue(2, 2)
    run_message("default", read(redis)[1])
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("canceltask", queued.id, done.id, "f" * 32, stdout=out, stderr=err)
    assert exited.value.code == 1
    assert f"{queued.id}: cancelled" in out.getvalue()
    assert f"{done.id}: not cancelled, it is SUCCESSFUL" in err.getvalue()
    assert "unknown" in err.getvalue()
    assert_cancelled(jobs.add, queued.id)
    out = io.StringIO()
    call_command("canceltask", queued.id, stdout=out)  # again: still cancelled, exit 0
    assert "cancelled" in out.getvalue()


def test_canceltask_refuses_what_is_not_an_id_and_cancels_nothing(jobs, redis):
    queued = jobs.add.enqueue(1, 1)
    with pytest.raises(CommandError, match="Not a task result id: 'no-such id'"):
        call_command("canceltask", queued.id, "no-such id")
    assert jobs.add.get_result(queued.id).status == "READY"
