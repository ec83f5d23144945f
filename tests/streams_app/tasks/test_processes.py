"""Django Tasks run by real ``manage.py runconsumer`` processes (tests.tasks_settings)."""
import pytest

from tests.waiting import wait_for

pytestmark = pytest.mark.slow

FAST = {"PENDING_TIMEOUT_MS": 1500, "CLAIM_INTERVAL_MS": 300}


def finished(task, result_id):
    def check():
        result = task.get_result(result_id)
        return result if result.is_finished else None
    return check


def test_runconsumer_without_arguments_runs_an_enqueued_task_to_a_successful_result(jobs, run_workers):
    result = jobs.add.enqueue(2, 3)
    assert jobs.add.get_result(result.id).status == "READY"
    proc = run_workers()
    done = wait_for(finished(jobs.add, result.id), timeout=60, what="the task finished")
    assert done.status == "SUCCESSFUL", done.errors
    assert done.return_value == 5
    assert done.attempts == 1 and len(done.worker_ids) == 1
    assert done.enqueued_at <= done.started_at <= done.last_attempted_at <= done.finished_at
    assert "tasks:default:workers" in proc.output() and "tasks:emails:workers" in proc.output()


def test_a_task_that_raises_is_failed_with_the_exception_and_dead_lettered(jobs, run_workers, redis):
    result = jobs.fail.enqueue("boom")
    run_workers("tasks:default:workers")
    done = wait_for(finished(jobs.fail, result.id), timeout=60, what="the task finished")
    assert done.status == "FAILED"
    [error] = done.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "ValueError: boom" in error.traceback and "tests/testapp/tasks.py" in error.traceback
    wait_for(lambda: redis.xlen("{tasks:default}:dlq") == 1, timeout=30, what="the message dead-lettered")
    with pytest.raises(ValueError, match="failed"):
        done.return_value  # noqa: B018 -- Django raises for the return value of a failed task
