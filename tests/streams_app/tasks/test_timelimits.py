"""Time limits (issue 45): ``@task(timeout=)`` and OPTIONS["TIMEOUT"]. An attempt past its limit ends with
TaskTimeout (FAILED, or retried when retry_on covers it); a sync task's worker process is replaced so
its capacity comes back (streams_app/tasks/timelimits.py); an async task is cancelled."""
import signal

import pytest

from streams_app.tasks import TaskTimeout
from streams_app.tasks.api import InvalidTask
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db


def finished(task, result_id, timeout=60):
    return wait_for(lambda: (r := task.get_result(result_id)).is_finished and r, timeout=timeout,
                    what=f"result {result_id} finished")


@pytest.mark.parametrize("selector", ["tasks:default:workers", "tasks:default:async:workers"])
def test_three_tasks_past_their_timeout_fail_and_free_a_one_thread_worker(jobs, run_workers, redis, tmp_path,
                                                                         selector):
    task = jobs.overruns if selector == "tasks:default:workers" else jobs.async_overruns
    logs = [tmp_path / f"run{i}" for i in range(3)]
    overrun = [task.enqueue(str(log), 60) for log in logs]
    quick = jobs.add.enqueue(2, 3) if selector == "tasks:default:workers" else jobs.async_add.enqueue(2, 3)
    proc = run_workers(selector, "--threads", "1", "--concurrency", "1")
    for result in overrun:
        done = finished(task, result.id, timeout=60)
        assert done.status == "FAILED"
        [error] = done.errors
        assert error.exception_class is TaskTimeout and "ran past its timeout of 2 s" in error.traceback
    # The one thread (or slot) came back: the task queued behind the three ran.
    value = finished(jobs.add if selector == "tasks:default:workers" else jobs.async_add, quick.id).return_value
    assert value == 5 if selector == "tasks:default:workers" else value["sum"] == 5
    assert all(log.read_text() == "started\n" for log in logs)  # stopped, never finished late
    # FAILED tasks are dead-lettered (replayable), nothing left pending.
    stream = "tasks:default" if selector == "tasks:default:workers" else "tasks:default:async"
    wait_for(lambda: redis.xpending(stream, "workers")["pending"] == 0, timeout=30, what="nothing pending")
    assert redis.xlen(f"{{{stream}}}:dlq") == 3
    if selector == "tasks:default:workers":  # the process was replaced in place (no supervisor): exec, same pid
        assert proc.proc.poll() is None
        proc.wait_for_output("replacing this process", timeout=5)


def test_a_supervised_worker_past_a_timeout_is_replaced_without_counting_a_crash(jobs, run_workers, redis, tmp_path):
    logs = [tmp_path / f"run{i}" for i in range(3)]
    overrun = [jobs.overruns.enqueue(str(log), 60) for log in logs]
    proc = run_workers("tasks:default:workers", "--workers", "1", "--threads", "1")
    for result in overrun:
        assert finished(jobs.overruns, result.id).status == "FAILED"
    assert finished(jobs.add, jobs.add.enqueue(1, 1).id).return_value == 2
    proc.wait_for_output("asked to be replaced (a task ran past its timeout)", timeout=5)
    assert proc.proc.poll() is None  # three replacements are not a crash loop


def test_a_timeout_is_retried_when_retry_on_covers_it(jobs, run_workers, tmp_path):
    result = jobs.overruns_then_succeeds.enqueue(str(tmp_path / "runs"))
    run_workers("tasks:default:workers", "--threads", "1")
    done = finished(jobs.overruns_then_succeeds, result.id)
    assert (done.status, done.attempts, done.return_value) == ("SUCCESSFUL", 2, "second time")
    assert done.errors[0].exception_class is TaskTimeout


def test_the_other_in_flight_tasks_of_a_replaced_worker_are_delivered_again(jobs, run_workers, redis, tmp_path):
    # Four threads: the overrun beside three 5 s sleepers; the replacement stops them, and they run again.
    sleepers = [jobs.sleepy.enqueue(5) for _ in range(3)]
    overrun = jobs.overruns.enqueue(str(tmp_path / "run"), 60)
    run_workers("tasks:default:workers", "--threads", "4", "--batch", "1")
    assert finished(jobs.overruns, overrun.id).status == "FAILED"
    done = [finished(jobs.sleepy, result.id) for result in sleepers]
    assert all(d.status == "SUCCESSFUL" and d.attempts == 2 for d in done)
    # Run again side by side, not one by one as suspects of a crash: the process was replaced on purpose.
    assert max(d.last_attempted_at for d in done) < min(d.finished_at for d in done)


def test_a_timeout_while_runconsumer_stops_ends_the_process_instead_of_starting_a_new_one(jobs, run_workers, tmp_path):
    log = tmp_path / "run"
    result = jobs.overruns.enqueue(str(log), 60)
    proc = run_workers("tasks:default:workers", "--threads", "1")
    wait_for(lambda: log.exists(), timeout=60, what="the task started")
    proc.signal(signal.SIGTERM)  # the shutdown timeout (30 s) is longer than the task's limit (2 s)
    assert proc.wait(timeout=60) == 2  # EXIT_FORCED: stopped; it did not exec a fresh consumer
    assert finished(jobs.overruns, result.id).status == "FAILED"


def test_a_limit_too_long_to_wait_in_one_go_leaves_the_other_limits_working(jobs, run_workers, tmp_path):
    first = jobs.huge_timeout.enqueue()
    overrun = jobs.overruns.enqueue(str(tmp_path / "run"), 60)
    run_workers("tasks:default:workers", "--threads", "1", "--batch", "1")
    assert finished(jobs.huge_timeout, first.id).return_value == "in time"
    assert finished(jobs.overruns, overrun.id).status == "FAILED"


def test_finished_watches_do_not_pile_up_until_their_deadline():
    from streams_app.tasks.timelimits import Watchdog

    watchdog = Watchdog()
    for _ in range(5000):
        watch = watchdog.watch(object(), 3600)
        assert watch.finish()
    assert len(watchdog.heap) <= 1500  # rebuilt without the finished ones; not 5,000 held for an hour
    pending = watchdog.watch(object(), 3600)
    assert pending in [item[2] for item in watchdog.heap]


@pytest.mark.parametrize("name", ["raises_its_own_timeout", "async_raises_its_own_timeout"])
def test_a_timeout_error_of_the_tasks_own_is_not_taken_for_its_time_limit(jobs, run_workers, name):
    task = getattr(jobs, name)
    result = task.enqueue()
    run_workers("tasks:default:async:workers" if name.startswith("async") else "tasks:default:workers")
    [error] = finished(task, result.id).errors
    assert error.exception_class is TimeoutError and "socket timeout" in error.traceback


def test_options_timeout_is_the_backends_default(jobs, run_workers, tmp_path):
    result = jobs.sleepy.enqueue(60)
    run_workers("tasks:default:workers", "--threads", "1", options={"TIMEOUT": 1})
    done = finished(jobs.sleepy, result.id)
    assert done.status == "FAILED" and done.errors[0].exception_class is TaskTimeout


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), True, "5", 10 ** 400])
def test_bad_timeouts_are_refused_at_declaration(jobs, timeout):
    from streams_app.tasks import task

    with pytest.raises(InvalidTask, match="timeout is the seconds one attempt may run, more than 0"):
        task(timeout=timeout)(jobs.not_a_task)


def test_the_system_checks_name_a_bad_timeout_option(settings):
    from django.core.checks import run_checks

    settings.TASKS = {"default": {"BACKEND": "streams_app.tasks.StreamsBackend", "OPTIONS": {"TIMEOUT": 0}}}
    found = [str(m) for m in run_checks(databases=[]) if "TIMEOUT" in str(m)]
    assert found and "TIMEOUT is the seconds one attempt may run, more than 0" in found[0]


def test_using_keeps_the_timeout(jobs):
    assert jobs.overruns.using(priority=5).timeout == 2


def test_the_system_checks_name_a_tasks_module_that_fails_to_import(settings, tmp_path, monkeypatch):
    import sys

    from django.core.checks import run_checks

    app = tmp_path / "badtasksapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tasks.py").write_text("from streams_app.tasks import task\n\n\n@task(timeout=0)\ndef never():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "badtasksapp"]
    try:
        found = [m for m in run_checks(databases=[]) if m.id == "streams_app.E069"]
    finally:
        sys.modules.pop("badtasksapp.tasks", None)
        sys.modules.pop("badtasksapp", None)
    assert len(found) == 1 and "badtasksapp.tasks fails to import" in found[0].msg
    assert "timeout is the seconds one attempt may run" in found[0].msg
