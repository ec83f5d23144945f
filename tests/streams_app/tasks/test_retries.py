"""Per-task retries (issue 45): ``streams_app.tasks.task(max_attempts=, backoff=, retry_on=)``, ``Retry``,
``exponential``, OPTIONS MAX_ATTEMPTS/BACKOFF (MAX_RETRIES deprecated). A retry is a deferred message:
the failed entry is acked, so a waiting retry holds no worker thread and no pending entry."""
import pytest

from streams_app.exceptions import RejectMessage
from streams_app.publishing.message import Message
from streams_app.tasks import Retry, exponential
from streams_app.tasks.api import InvalidTask
from streams_app.tasks.runner import run_message
from tests import tasks_settings
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db


def run_all(redis, stream="tasks:default"):
    """Run every entry of ``stream`` in order, retries published meanwhile included (backoff 0: straight
    onto the stream); returns how each ended: "acked" or the exception the consumer would get."""
    seen, ended = set(), []
    while True:
        todo = [(entry_id, fields) for entry_id, fields in redis.xrange(stream) if entry_id not in seen]
        if not todo:
            return ended
        for entry_id, fields in todo:
            seen.add(entry_id)
            try:
                run_message("default", Message(entry_id, stream, "workers", fields, deliveries=1, consumer="w-1"))
                ended.append("acked")
            except Exception as exc:  # noqa: BLE001
                ended.append(exc)


def test_a_task_retried_until_it_succeeds_keeps_every_error(jobs, redis, tmp_path):
    result = jobs.flaky.enqueue(str(tmp_path / "runs"), 2)
    assert run_all(redis) == ["acked", "acked", "acked"]  # two failed attempts acked: each retry is a new message
    done = jobs.flaky.get_result(result.id)
    assert (done.status, done.return_value, done.attempts) == ("SUCCESSFUL", 3, 3)
    assert [e.exception_class_path for e in done.errors] == ["builtins.ConnectionError"] * 2


def test_a_task_out_of_attempts_is_failed_with_every_attempts_error(jobs, redis, tmp_path):
    result = jobs.flaky.enqueue(str(tmp_path / "runs"), 10)
    ended = run_all(redis)
    assert ended[:2] == ["acked", "acked"] and isinstance(ended[2], RejectMessage) and len(ended) == 3
    done = jobs.flaky.get_result(result.id)
    assert (done.status, done.attempts, len(done.errors)) == ("FAILED", 3, 3)
    assert "run 3 failed" in done.errors[2].traceback


def test_an_exception_outside_retry_on_fails_at_once(jobs, redis):
    retried, failed = jobs.picky.enqueue("connection"), jobs.picky.enqueue("value")
    run_all(redis)
    assert jobs.picky.get_result(retried.id).attempts == 3
    once = jobs.picky.get_result(failed.id)
    assert (once.status, once.attempts) == ("FAILED", 1)


def test_retry_raised_by_the_task_is_honoured_with_its_own_delay(jobs, redis, tmp_path):
    result = jobs.asks_again.enqueue(str(tmp_path / "runs"))
    assert run_all(redis) == ["acked", "acked"]  # after=0 wins over the task's backoff of 60 s
    done = jobs.asks_again.get_result(result.id)
    assert (done.status, done.attempts, done.return_value) == ("SUCCESSFUL", 2, "done")
    assert done.errors[0].exception_class is Retry and "not yet" in done.errors[0].traceback


@pytest.mark.parametrize("name, said", [("backoff_raises", "raised ZeroDivisionError: backoff bug"),
                                        ("backoff_negative", "returned -1")])
def test_a_backoff_that_cannot_say_when_fails_the_task_with_both_errors(jobs, redis, name, said):
    task = getattr(jobs, name)
    result = task.enqueue()
    [ended] = run_all(redis)
    assert isinstance(ended, RejectMessage) and said in str(ended)  # dead-lettered: replayable, not lost
    done = task.get_result(result.id)
    assert done.status == "FAILED"
    assert [e.exception_class_path for e in done.errors] == ["builtins.ConnectionError",
                                                             "streams_app.tasks.retries.BackoffError"]


def test_a_waiting_retry_is_a_deferred_message_and_holds_no_pending_entry(jobs, run_workers, redis, tmp_path):
    result = jobs.flaky_later.enqueue(str(tmp_path / "runs"), 1)
    run_workers("tasks:default:workers")
    wait_for(lambda: len(jobs.flaky_later.get_result(result.id).errors) == 1, timeout=60, what="the first attempt failed")
    # The failed entry is acked just after its result is written (the chunk's end): no pending entry waits.
    wait_for(lambda: redis.xpending("tasks:default", "workers")["pending"] == 0, timeout=30,
             what="the failed entry acked")
    waiting = jobs.flaky_later.get_result(result.id)
    assert (waiting.status, len(waiting.errors)) == ("READY", 1)  # still waiting: its retry is due 5 s later
    assert redis.zcard("{tasks:default}:scheduled") == 1
    done = wait_for(lambda: (r := jobs.flaky_later.get_result(result.id)).is_finished and r, timeout=60,
                    what="the retry ran")
    assert (done.status, done.attempts, done.return_value) == ("SUCCESSFUL", 2, 2)
    assert (done.last_attempted_at - done.started_at).total_seconds() >= 4.5  # its backoff, not the consumer's


@pytest.mark.parametrize("arguments, said", [
    ({"max_attempts": 0}, "max_attempts is the number of attempts in all, 1 or more"),
    ({"max_attempts": True}, "max_attempts"),
    ({"backoff": -1}, "backoff must be seconds"),
    ({"backoff": float("nan")}, "backoff must be seconds"),
    ({"retry_on": "ValueError"}, "retry_on must be an exception class"),
    ({"retry_on": (ValueError, int)}, "retry_on must be an exception class"),
])
def test_bad_retry_arguments_are_refused_at_declaration(jobs, arguments, said):
    from streams_app.tasks import task

    with pytest.raises(InvalidTask, match=said):
        task(**arguments)(jobs.not_a_task)


def test_using_keeps_the_retry_arguments(jobs):
    moved = jobs.picky.using(queue_name="emails", priority=10)
    assert (moved.max_attempts, moved.backoff, moved.retry_on) == (3, 0, (ConnectionError,))


def test_retry_arguments_need_a_streams_backend(jobs, settings):
    from streams_app.tasks import task

    settings.TASKS = {"default": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend"}} if _backport() \
        else {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}

    with pytest.raises(InvalidTask, match="max_attempts needs a StreamsBackend"):
        task(max_attempts=2)(jobs.not_a_task)
    assert task()(jobs.not_a_task).func is jobs.not_a_task  # without them it is Django's @task on any backend


def _backport():
    try:
        import django.tasks  # noqa: F401
    except ImportError:
        return True
    return False


def test_exponential_doubles_up_to_its_cap_with_jitter_below_it():
    plain = exponential(base=2, cap=10, jitter=False)
    assert [plain(n) for n in range(1, 6)] == [2, 4, 8, 10, 10]
    jittered = exponential(base=2, cap=10)
    assert all(0 <= jittered(n) <= min(10, 2 * 2 ** (n - 1)) for n in range(1, 20) for _ in range(20))
    assert exponential(jitter=False)(1000) == 300  # no overflow for a large attempt number
    with pytest.raises(ValueError, match="seconds"):
        exponential(base=-1)
    with pytest.raises(ValueError, match="seconds"):
        Retry(after=-5)


def test_options_max_attempts_and_backoff_are_the_backends_defaults(jobs, redis, settings):
    settings.TASKS = {"default": {**tasks_settings.TASKS["default"], "OPTIONS": {"MAX_ATTEMPTS": 2, "BACKOFF": 0}}}
    result = jobs.fail.enqueue("no")  # a plain Django @task: the backend's defaults
    ended = run_all(redis)
    assert ended[0] == "acked" and isinstance(ended[1], RejectMessage)
    assert jobs.fail.get_result(result.id).attempts == 2


@pytest.mark.parametrize("given, found", [
    ({"MAX_RETRIES": 2}, "streams_app.W060"),
    ({"MAX_ATTEMPTS": 0}, "streams_app.E060"),
    ({"MAX_ATTEMPTS": 3, "MAX_RETRIES": 2}, "streams_app.E060"),
    ({"BACKOFF": -2}, "streams_app.E060"),
    ({"BACKOFF": "soon"}, "streams_app.E060"),
])
def test_the_system_checks_name_bad_or_deprecated_retry_options(settings, given, found):
    from streams_app.tasks.checks import check_tasks_settings

    settings.TASKS = {"default": {**tasks_settings.TASKS["default"], "OPTIONS": given}}
    assert found in [message.id for message in check_tasks_settings()]


def test_max_retries_still_means_max_attempts_minus_one(settings):
    from streams_app.tasks import options

    assert options.merged({"MAX_RETRIES": 2})["MAX_ATTEMPTS"] == 3
    assert options.merged({})["MAX_ATTEMPTS"] == 1


def test_a_task_started_receiver_that_raises_fails_the_attempt_instead_of_leaving_it_running(jobs, redis, settings):
    """Found by a user trial: the result stayed RUNNING for good while the entry was redelivered to its end."""
    from streams_app.tasks.api import task_started

    def refuse(sender, task_result, **kwargs):
        raise RuntimeError("start receiver boom")

    task_started.connect(refuse)
    try:
        failing = jobs.add.enqueue(1, 2)
        [ended] = run_all(redis)
        assert isinstance(ended, RejectMessage) and "start receiver boom" in str(ended)
        done = jobs.add.get_result(failing.id)
        assert (done.status, done.attempts) == ("FAILED", 1) and done.errors[0].exception_class is RuntimeError
        settings.TASKS = {"default": {**tasks_settings.TASKS["default"], "OPTIONS": {"MAX_ATTEMPTS": 2, "BACKOFF": 0}}}
        retried = jobs.add.enqueue(3, 4)
        run_all(redis)
        again = jobs.add.get_result(retried.id)
        assert (again.status, again.attempts, len(again.errors)) == ("FAILED", 2, 2)
    finally:
        task_started.disconnect(refuse)


def test_using_onto_a_backend_that_is_not_shoals_refuses_the_retry_arguments(jobs, settings):
    """A user trial: .using(backend="other") kept a ShoalTask whose retries the other backend ignored."""
    immediate = ("django_tasks.backends.immediate.ImmediateBackend" if _backport()
                 else "django.tasks.backends.immediate.ImmediateBackend")
    settings.TASKS = {**tasks_settings.TASKS, "other": {"BACKEND": immediate}}
    with pytest.raises(InvalidTask, match="max_attempts, backoff, retry_on need a StreamsBackend; backend 'other'"):
        jobs.picky.using(backend="other")


def test_a_task_cancelled_while_it_waits_for_its_retry_says_so(jobs, redis, tmp_path, settings):
    from streams_app.tasks import cancel

    result = jobs.flaky_later.enqueue(str(tmp_path / "runs"), 5)
    run_all(redis)  # attempt 1 fails; its retry is deferred 5 s
    assert cancel(result.id) is True
    done = jobs.flaky_later.get_result(result.id)
    assert (done.status, done.attempts) == ("FAILED", 1)
    assert "while it waited for its retry" in done.errors[-1].traceback


def test_an_explicit_max_retries_of_0_is_deprecated_too(settings):
    from streams_app.tasks.checks import check_tasks_settings

    settings.TASKS = {"default": {**tasks_settings.TASKS["default"], "OPTIONS": {"MAX_RETRIES": 0}}}
    assert "streams_app.W060" in [message.id for message in check_tasks_settings()]
