"""Django Tasks run by real ``manage.py runconsumer`` processes (tests.tasks_settings)."""
import datetime as dt
import json
import signal
import sys

import pytest
from django.utils import timezone

from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.both_redis]

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
    proc.wait_for_output("tasks:emails:workers")  # both queues run, beside any @consumer handlers
    assert "tasks:default:workers" in proc.output()


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


def test_a_worker_killed_mid_task_leaves_it_to_another_that_runs_it_again_to_success(jobs, run_workers, tmp_path):
    marker = tmp_path / "first-attempt"
    result = jobs.slow_first_attempt.enqueue(str(marker))
    first = run_workers("tasks:default:workers", streams=FAST)
    wait_for(marker.exists, timeout=60, what="the first attempt started")
    running = jobs.slow_first_attempt.get_result(result.id)
    assert running.status == "RUNNING" and running.attempts == 1
    assert int(marker.read_text()) == first.pid  # the attempt runs in the process about to be killed
    first.kill()
    second = run_workers("tasks:default:workers", streams=FAST)
    done = wait_for(finished(jobs.slow_first_attempt, result.id), timeout=60, what="the task finished")
    assert done.status == "SUCCESSFUL", done.errors
    assert done.return_value == {"attempt": 2}
    assert done.attempts == 2 and len(set(done.worker_ids)) == 2
    assert done.errors == []
    assert second.proc.poll() is None


def test_a_deferred_task_does_not_start_before_run_after_and_starts_soon_after(jobs, run_workers):
    run_workers("tasks:default:workers")
    run_after = timezone.now() + dt.timedelta(seconds=3)
    result = jobs.add.using(run_after=run_after).enqueue(20, 22)
    waiting = jobs.add.get_result(result.id)
    assert waiting.status == "READY" and waiting.started_at is None
    done = wait_for(finished(jobs.add, result.id), timeout=60, what="the deferred task finished")
    assert done.status == "SUCCESSFUL" and done.return_value == 42
    assert done.started_at >= run_after
    assert done.started_at - run_after < dt.timedelta(seconds=2.5)  # the consumers move due messages each pass


@pytest.mark.parametrize("path", ["os.system", "tests.testapp.tasks.not_a_task", "antigravity.fly",
                                  "tests.testapp.tasks.nothing_here"])
def test_a_message_naming_anything_but_a_task_is_dead_lettered_and_never_run(path, run_workers, redis, tmp_path):
    payload = {"id": "x" * 32, "task": path, "args": [f"touch {tmp_path}/ran"], "kwargs": {}}
    redis.xadd("tasks:default", {"payload": json.dumps(payload)})
    run_workers("tasks:default:workers")
    wait_for(lambda: redis.xlen("{tasks:default}:dlq") == 1, timeout=60, what="the message dead-lettered")
    [(_, fields)] = redis.xrange("{tasks:default}:dlq")
    assert "not run" in fields["shoal:error"], fields
    assert fields["shoal:error"].startswith("TaskRefused: ")  # streams_app.tasks.lookup's RejectMessage
    assert fields["shoal:deliveries"] == "1"  # at once: no retry can make it a task
    assert "antigravity" not in sys.modules
    assert not (tmp_path / "ran").exists()
    assert not redis.exists("shoal:task:{" + "x" * 32 + "}")  # no result was made for it


def test_a_task_renamed_after_its_enqueue_ends_failed_not_ready(jobs, run_workers, redis):
    """The trial's poll ``while not result.is_finished`` ends: the refusal is the result's error."""
    result = jobs.add.enqueue(1, 2)
    [(entry_id, fields)] = redis.xrange("tasks:default")
    payload = json.loads(fields["payload"])
    redis.xdel("tasks:default", entry_id)
    redis.xadd("tasks:default", {**fields, "payload": json.dumps({**payload, "task": "tests.testapp.tasks.add_v1"})})
    proc = run_workers("tasks:default:workers")
    done = wait_for(finished(jobs.add, result.id), timeout=60, what="the refused task's result finished")
    assert (done.status, done.attempts) == ("FAILED", 0)
    assert done.errors[0].exception_class_path == "streams_app.tasks.lookup.TaskRefused"
    proc.wait_for_output("Refused a task message, not run and dead-lettered: 'tests.testapp.tasks.add_v1' is nothing")


def test_with_one_thread_higher_priority_tasks_run_before_lower_ones_already_waiting(jobs, run_workers, tmp_path):
    log = tmp_path / "order"
    expected = {"high": [], "normal": [], "low": []}
    results = []
    for round_ in range(3):  # enqueued interleaved, low first: the order they run in is the bands'
        for band, priority in (("low", -50), ("normal", 0), ("high", 100)):
            label = f"{band}{round_}"
            expected[band].append(label)
            results.append(jobs.note.using(priority=priority).enqueue(str(log), label))
    run_workers("tasks:default:workers", "--threads", "1")
    wait_for(lambda: all(jobs.note.get_result(r.id).is_finished for r in results), timeout=60,
             what="every task finished")
    ran = [line.split()[0] for line in log.read_text().splitlines()]
    assert ran == expected["high"] + expected["normal"] + expected["low"]


def test_async_tasks_are_awaited_on_the_workers_event_loop_side_by_side(jobs, run_workers, redis):
    result = jobs.async_add.enqueue(40, 2)
    assert redis.xlen("tasks:default:async") == 1 and not redis.exists("tasks:default")
    waits = [jobs.async_wait.enqueue(1.0) for _ in range(20)]
    run_workers("tasks:default:async:workers", "--threads", "1", "--concurrency", "20")
    done = wait_for(finished(jobs.async_add, result.id), timeout=60, what="the async task finished")
    assert done.status == "SUCCESSFUL", done.errors
    assert done.return_value == {"sum": 42, "thread": "shoal-asyncio"}
    wait_for(lambda: all(jobs.async_wait.get_result(r.id).is_finished for r in waits), timeout=60,
             what="the waits finished")
    spans = sorted((s["started"], s["ended"]) for s in (jobs.async_wait.get_result(r.id).return_value for r in waits))
    # With one handler thread, waits run one after another there; on the event loop they overlap.
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))


def test_a_task_that_takes_context_gets_its_attempt_and_result(jobs, run_workers):
    result = jobs.context_info.enqueue()
    run_workers("tasks:default:workers")
    done = wait_for(finished(jobs.context_info, result.id), timeout=60, what="the task finished")
    assert done.return_value == {"attempt": 1, "id": result.id}


def test_a_task_of_the_emails_queue_runs_under_that_queues_selector_only(jobs, run_workers, redis):
    email = jobs.send_email.enqueue("a@example.com", subject="hi")
    other = jobs.add.enqueue(1, 1)
    run_workers("tasks:emails:workers")
    done = wait_for(finished(jobs.send_email, email.id), timeout=60, what="the email task finished")
    assert done.return_value == {"to": "a@example.com", "subject": "hi"}
    assert jobs.add.get_result(other.id).status == "READY"
    assert redis.xlen("tasks:default") == 1


def test_deferred_tasks_survive_a_sigkill_of_the_worker_moving_them_each_moved_once(jobs, run_workers, redis):
    run_after = timezone.now() + dt.timedelta(seconds=1)
    results = [jobs.add.using(run_after=run_after + dt.timedelta(milliseconds=5 * n)).enqueue(n, 0)
               for n in range(200)]
    assert redis.zcard("{tasks:default}:scheduled") == 200
    first = run_workers("tasks:default:workers", streams=FAST)
    wait_for(lambda: redis.exists("tasks:default") and redis.xlen("tasks:default") > 0, timeout=30,
             what="the first due tasks moved")
    first.kill()  # while it moves the rest (200 due over a second), and runs what it moved
    run_workers("tasks:default:workers", streams=FAST)
    wait_for(lambda: all(jobs.add.get_result(r.id).is_finished for r in results), timeout=60,
             what="every deferred task finished")
    assert {jobs.add.get_result(r.id).status for r in results} == {"SUCCESSFUL"}
    assert [jobs.add.get_result(r.id).return_value for r in results] == list(range(200))
    assert redis.xlen("tasks:default") == 200  # each moved onto the stream exactly once
    assert redis.zcard("{tasks:default}:scheduled") == 0


def test_sigterm_lets_a_running_task_finish_and_the_worker_exit_0(jobs, run_workers):
    result = jobs.sleepy.enqueue(1.5)
    proc = run_workers("tasks:default:workers")
    wait_for(lambda: jobs.sleepy.get_result(result.id).status == "RUNNING", timeout=60, what="the task running")
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()
    done = jobs.sleepy.get_result(result.id)
    assert (done.status, done.return_value, done.attempts) == ("SUCCESSFUL", 1.5, 1)


def test_replaying_a_failed_tasks_dead_letter_runs_it_again_as_a_second_attempt(jobs, run_workers, redis):
    result = jobs.fail.enqueue("boom")
    run_workers("tasks:default:workers")
    wait_for(lambda: redis.xlen("{tasks:default}:dlq") == 1, timeout=60, what="the dead letter")
    replay = run_workers("tasks:default", "--group", "workers", "--all", command="replay")
    assert replay.wait(60) == 0, replay.output()
    done = wait_for(lambda: len(jobs.fail.get_result(result.id).errors) == 2 and jobs.fail.get_result(result.id),
                    timeout=60, what="the second attempt failed too")
    assert done.status == "FAILED" and done.attempts == 2


def test_a_queue_named_without_its_group_is_refused_naming_both_of_its_selectors(run_workers):
    """``runconsumer tasks:emails``, the guess of Celery's ``-Q emails``; a band alone likewise."""
    proc = run_workers("tasks:emails")
    assert proc.wait(60) == 3, proc.output()
    assert "for 'tasks:emails' select tasks:emails:workers tasks:emails:async:workers" in proc.output()
    proc = run_workers("tasks:emails:high:workers")
    assert proc.wait(60) == 3, proc.output()
    assert "'tasks:emails:high' is a priority band of tasks:emails:workers" in proc.output()


def test_the_start_up_line_names_selectors_not_the_bands_streams(run_workers):
    proc = run_workers("tasks:emails:workers")
    proc.wait_for_output("started (")
    [line] = [line for line in proc.output().splitlines() if "started (" in line]
    assert "started (tasks:emails:workers (bands tasks:emails:high, tasks:emails, tasks:emails:low);" in line
    assert "tasks:emails:high:workers" not in line
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.output()
