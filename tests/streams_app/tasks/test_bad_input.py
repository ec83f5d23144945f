"""Bad input to the StreamsBackend: each is refused at the call with Django's exception (or a clear
one), and nothing is published or stored."""
import datetime as dt

import pytest
from django.utils import timezone

from streams_app.tasks.api import InvalidTask, TaskResultDoesNotExist, task_backends

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


def nothing_written(redis):
    return redis.keys("*") == []


def test_an_unknown_queue_name_is_refused(jobs, redis):
    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid"):
        jobs.add.using(queue_name="nope").enqueue(1, 2)
    assert nothing_written(redis)


def test_a_lambda_or_a_nested_function_is_not_a_task(jobs):
    with pytest.raises(InvalidTask, match="module level"):
        task()(lambda: 1)

    def nested():
        return 1

    with pytest.raises(InvalidTask, match="module level"):
        task()(nested)


def test_an_argument_that_is_not_json_raises_at_enqueue_and_nothing_is_published(jobs, redis):
    with pytest.raises(TypeError, match="Unsupported type"):
        jobs.add.enqueue(object(), 1)
    with pytest.raises(TypeError, match="Unsupported type"):
        jobs.send_email.enqueue("a@example.com", subject={1, 2})
    with pytest.raises(ValueError, match="Unsupported value"):
        jobs.add.enqueue(b"\xff", b"")
    assert nothing_written(redis)


def test_a_naive_run_after_is_refused(jobs, redis, settings):
    naive = dt.datetime.now() + dt.timedelta(minutes=5)
    with pytest.raises(InvalidTask, match="aware datetime"):
        jobs.add.using(run_after=naive).enqueue(1, 2)
    assert nothing_written(redis)


def test_a_priority_out_of_range_is_refused(jobs, redis):
    for priority in (101, -101, 1.5):
        with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
            jobs.add.using(priority=priority).enqueue(1, 2)
    assert nothing_written(redis)


@pytest.mark.parametrize("result_id", ["", "no such id", "a" * 32, "../../etc", "x" * 200, None, 42])
def test_a_result_id_that_is_not_one_raises_task_result_does_not_exist(jobs, redis, result_id):
    with pytest.raises(TaskResultDoesNotExist):
        jobs.add.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result_id)


def test_a_publish_that_fails_leaves_no_result_behind(jobs, redis):
    redis.set("tasks:default", "not a stream")
    with pytest.raises(Exception, match="not a stream"):
        jobs.add.enqueue(1, 2)
    assert redis.keys("shoal:task:*") == [] and redis.zcard("shoal:tasks:{default}:results") == 0


def test_an_aware_run_after_in_the_past_is_accepted(jobs, redis):
    result = jobs.add.using(run_after=timezone.now() - dt.timedelta(seconds=1)).enqueue(1, 2)
    assert jobs.add.get_result(result.id).status == "READY"


def test_a_timedelta_run_after_counts_from_using_and_a_negative_one_is_refused(jobs, redis):
    before = timezone.now()
    deferred = jobs.add.using(run_after=dt.timedelta(minutes=5))
    assert before + dt.timedelta(minutes=5) <= deferred.run_after <= timezone.now() + dt.timedelta(minutes=5)
    result = deferred.enqueue(1, 2)
    assert redis.zcard("{tasks:default}:scheduled") == 1
    assert jobs.add.get_result(result.id).status == "READY"
    with pytest.raises(InvalidTask, match="negative"):
        jobs.add.using(run_after=dt.timedelta(seconds=-1))


@pytest.mark.parametrize("field, value", [("status", "DONE"), ("args", "not json"), ("enqueued_at", "yesterday"),
                                          ("priority", "high")])
def test_a_stored_result_that_is_malformed_raises_task_result_does_not_exist_saying_so(jobs, redis, field, value):
    from streams_app.tasks import results

    result = jobs.add.enqueue(1, 2)
    redis.hset(results.key(result.id), field, value)
    with pytest.raises(TaskResultDoesNotExist, match="cannot read"):
        jobs.add.get_result(result.id)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_nan_or_infinity_raises_value_error_at_enqueue_and_nothing_is_stored(jobs, redis, value):
    with pytest.raises(ValueError, match="no NaN or infinity"):
        jobs.add.enqueue(value, 1)
    with pytest.raises(ValueError, match="no NaN or infinity"):
        jobs.send_email.enqueue("a@example.com", subject={"x": [value]})
    assert nothing_written(redis)


def test_a_run_after_beyond_the_maximum_leaves_no_id_in_the_results_index(jobs, redis):
    with pytest.raises(Exception, match="RUN_AFTER_MAX"):
        jobs.add.using(run_after=timezone.now() + dt.timedelta(days=3650)).enqueue(3, 4)
    assert nothing_written(redis)
