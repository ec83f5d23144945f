"""Issue 44: a chunk's results in two round trips (QueueHandler.begin_chunk/end_chunk), enqueue in one,
enqueue_many. On one redis-server (a cluster runs tasks one by one: test_backend.py)."""
import time

import pytest

from shoal_common.redisconn import is_cluster
from streams_app.consuming.chunks import run_chunk
from streams_app.publishing.message import Message
from streams_app.tasks import enqueue_many, results
from streams_app.tasks.exceptions import EnqueueManyError
from streams_app.tasks.runner import QueueHandler

pytestmark = pytest.mark.django_db


def delivered(redis, stream="tasks:default"):
    return [Message(entry_id, stream, "workers", fields, deliveries=1, consumer="worker-1")
            for entry_id, fields in redis.xrange(stream)]


def calls(redis):
    stats = redis.info("commandstats")
    return {name[8:]: found["calls"] for name, found in stats.items()}


def quick(jobs, *tasks):
    """A QueueHandler that has timed ``tasks`` (default: add) as quick: begin_chunk starts them in one go."""
    handler = QueueHandler("default")
    for each in tasks or (jobs.add,):
        handler.timed(each.module_path, 0.001)
    return handler


@pytest.fixture(autouse=True)
def one_server(redis):
    if is_cluster(redis):
        pytest.skip("on a cluster each task is written on its own")


def test_a_chunk_is_two_round_trips_and_every_result_is_complete(jobs, redis):
    jobs.add.enqueue(0, 0)
    handler = quick(jobs)
    run_chunk(handler, delivered(redis))  # loads the scripts
    ids = [jobs.add.enqueue(n, 1).id for n in range(5)]
    redis.config_resetstat()
    outcome = run_chunk(handler, delivered(redis)[1:])
    assert len(outcome.acked) == 5 and not outcome.failed
    assert calls(redis).get("evalsha") == 2  # the chunk's starts, its successes
    for n, result_id in enumerate(ids):
        stored = jobs.add.get_result(result_id)
        assert (stored.status, stored.return_value, stored.worker_ids) == ("SUCCESSFUL", n + 1, ["worker-1"])
        assert stored.enqueued_at <= stored.started_at <= stored.last_attempted_at <= stored.finished_at


def test_a_failure_in_a_chunk_is_written_at_once_and_the_rest_succeed(jobs, redis):
    good, bad = jobs.add.enqueue(1, 1), jobs.fail.enqueue("no")
    outcome = run_chunk(QueueHandler("default"), delivered(redis))
    assert len(outcome.acked) == 1 and len(outcome.failed) == 1
    assert jobs.add.get_result(good.id).status == "SUCCESSFUL"
    failed = jobs.fail.get_result(bad.id)
    assert failed.status == "FAILED" and failed.errors[0].exception_class_path == "builtins.ValueError"


def test_the_chunks_successes_are_not_acked_when_they_cannot_be_written(jobs, redis):
    result = jobs.add.enqueue(1, 1)
    handler = QueueHandler("default")
    [message] = delivered(redis)
    handler.begin_chunk([message])
    handler(message)
    redis.config_set("maxmemory-policy", "noeviction")
    redis.config_set("maxmemory", "1")
    try:
        [(lost, exc)] = handler.end_chunk()
    finally:
        redis.config_set("maxmemory", "0")
    assert lost is message and "maxmemory" in str(exc)
    assert results.get(redis, result.id)["status"] == "RUNNING"  # not acked: taken over and run again


def test_tasks_the_chunk_did_not_reach_get_their_attempt_back(jobs, redis):
    """A chunk out of its time budget hands its rest back unrun: their starts are taken back, so the
    attempt they run as later is their first."""
    ran, unrun = jobs.add.enqueue(1, 1), jobs.add.enqueue(2, 2)
    handler = quick(jobs)
    first, second = delivered(redis)
    handler.begin_chunk([first, second])
    assert results.get(redis, unrun.id)["status"] == "RUNNING"
    handler(first)
    assert handler.end_chunk() == []
    assert jobs.add.get_result(ran.id).status == "SUCCESSFUL"
    back = results.get(redis, unrun.id)
    assert (back["status"], back["worker_ids"], back["started_at"]) == ("READY", [], None)
    run_chunk(QueueHandler("default"), [second])
    again = jobs.add.get_result(unrun.id)
    assert (again.status, again.attempts, again.return_value) == ("SUCCESSFUL", 1, 4)


def test_a_worker_killed_mid_chunk_leaves_its_results_running_for_the_takeover(jobs, redis):
    result = jobs.add.enqueue(1, 1)
    [message] = delivered(redis)
    quick(jobs).begin_chunk([message])  # the worker dies here: nothing acked, nothing ended
    taken_over = Message(message.id, message.stream, "workers", redis.xrange(message.stream)[0][1], deliveries=2,
                         consumer="worker-2")
    run_chunk(QueueHandler("default"), [taken_over])
    stored = jobs.add.get_result(result.id)
    assert (stored.status, stored.worker_ids) == ("SUCCESSFUL", ["worker-1", "worker-2"])


def test_only_tasks_timed_as_quick_start_before_they_run(jobs, redis):
    """A result must not show RUNNING long before its task runs: a task this thread never timed, one
    that ran slowly, and every task behind them in the chunk start when they run, as before."""
    first, second, third = jobs.add.enqueue(1, 1), jobs.sleepy.enqueue(0), jobs.add.enqueue(3, 3)
    handler = QueueHandler("default")
    handler.begin_chunk(delivered(redis))
    assert [results.get(redis, r.id)["status"] for r in (first, second, third)] == ["READY"] * 3  # never timed
    handler.end_chunk()
    handler = quick(jobs)
    handler.timed(jobs.sleepy.module_path, 2.0)
    handler.begin_chunk(delivered(redis))
    assert [results.get(redis, r.id)["status"] for r in (first, second, third)] == ["RUNNING", "READY", "READY"]
    handler.end_chunk()
    run_chunk(handler, delivered(redis))  # the rest start one by one and all finish
    assert [results.get(redis, r.id)["status"] for r in (first, second, third)] == ["SUCCESSFUL"] * 3


def test_a_run_is_timed_both_ways(jobs, redis):
    handler = QueueHandler("default")
    jobs.sleepy.enqueue(0.05)
    run_chunk(handler, delivered(redis))  # started on its own: never timed before
    assert handler.durations[jobs.sleepy.module_path] >= 0.05
    handler.timed(jobs.sleepy.module_path, 0.0)
    jobs.sleepy.enqueue(0.05)
    run_chunk(handler, delivered(redis)[1:])  # begun with the chunk: quick so far
    assert handler.durations[jobs.sleepy.module_path] >= 0.2 * 0.05


def test_enqueue_is_one_round_trip(jobs, redis):
    jobs.add.enqueue(0, 0)
    redis.config_resetstat()
    result = jobs.add.enqueue(1, 2)
    found = calls(redis)
    # One script (streams_app/lua/task_enqueue.lua): the commands it runs count, no MULTI around them.
    assert found.get("evalsha") == 1 and found.get("xadd") == 1 and found.get("hset") == 1
    assert "multi" not in found and "exec" not in found
    assert jobs.add.get_result(result.id).status == "READY"


def test_enqueue_many_writes_one_result_per_task_in_one_round_trip(jobs, redis):
    jobs.add.enqueue(0, 0)
    redis.config_resetstat()
    enqueued = enqueue_many(jobs.add, [((n,), {"b": n}) for n in range(10)])
    assert calls(redis).get("evalsha") == 1 and calls(redis).get("xadd") == 10
    assert [r.args for r in enqueued] == [[n] for n in range(10)]
    assert all(jobs.add.get_result(r.id).status == "READY" for r in enqueued)
    run_chunk(QueueHandler("default"), delivered(redis)[1:])
    assert [jobs.add.get_result(r.id).return_value for r in enqueued] == [2 * n for n in range(10)]


@pytest.mark.parametrize("bad, error", [
    ([((1,), {}), "not a pair"], "must be an \\(args, kwargs\\) pair"),
    ([((1,), {}), ({"a": 1}, {})], "must be a list or tuple"),
    ([((1,), {}), ((1,), [])], "must be a dict"),
    ([((1,), {}), ((object(),), {})], None),
    ([((1,), {}), ((float("nan"),), {})], "NaN"),
])
def test_enqueue_many_refuses_bad_input_before_writing_anything(jobs, redis, bad, error):
    with pytest.raises((TypeError, ValueError), match=error):
        enqueue_many(jobs.add, bad)
    assert not redis.exists("tasks:default")


def test_enqueue_many_takes_only_a_task_of_a_streams_backend(jobs):
    with pytest.raises(TypeError, match="takes a Django Task"):
        enqueue_many(lambda: None, [])


def test_a_batch_redis_refuses_is_taken_back_and_reported(jobs, redis, monkeypatch):
    redis.set("tasks:default", "not a stream")
    with pytest.raises(EnqueueManyError) as caught:
        enqueue_many(jobs.add, [((1,), {"b": 2})])
    assert caught.value.enqueued == []
    assert not redis.keys("shoal:task:*")


def test_a_quick_task_that_runs_long_once_gives_the_batch_behind_it_back(jobs, redis):
    """Timed as quick, ``sleepy`` runs past twice the batch's budget this once: the tasks behind it do not
    go on showing RUNNING; their starts are taken back and each starts as it runs, in the chunk's order."""
    slow, second, third = jobs.sleepy.enqueue(0.15), jobs.add.enqueue(2, 2), jobs.add.enqueue(3, 3)
    handler = quick(jobs, jobs.add, jobs.sleepy)
    chunk = delivered(redis)
    handler.begin_chunk(chunk)
    assert [results.get(redis, r.id)["status"] for r in (slow, second, third)] == ["RUNNING"] * 3
    handler(chunk[0])
    assert [results.get(redis, r.id)["status"] for r in (second, third)] == ["RUNNING"] * 2  # not past it yet
    handler(chunk[1])
    assert results.get(redis, third.id)["status"] == "READY"
    handler(chunk[2])
    assert handler.end_chunk() == []
    stored = [r.task.get_result(r.id) for r in (slow, second, third)]
    assert [(r.status, r.attempts) for r in stored] == [("SUCCESSFUL", 1)] * 3
    assert stored[0].finished_at <= stored[1].started_at <= stored[2].started_at


@pytest.mark.parametrize("kind", ["object", "nan", "infinity", "itself", "huge", "bad-repr"])
@pytest.mark.parametrize("begun", [False, True], ids=["alone", "in-a-batch"])
def test_a_return_value_that_is_not_json_fails_at_once_whatever_max_retries(jobs, redis, settings, kind, begun):
    """Running it again would return the same: FAILED at its first attempt with a reason, never READY, and
    never SUCCESSFUL with a NaN in the result."""
    from tests import tasks_settings

    settings.TASKS = {"default": {**tasks_settings.TASKS["default"], "OPTIONS": {"MAX_RETRIES": 2}}}
    result = jobs.returns.enqueue(kind)
    handler = quick(jobs, jobs.returns) if begun else QueueHandler("default")
    outcome = run_chunk(handler, delivered(redis))
    assert not outcome.acked and len(outcome.failed) == 1
    stored = jobs.returns.get_result(result.id)
    assert (stored.status, stored.attempts) == ("FAILED", 1)
    assert stored.errors[0].exception_class_path == "streams_app.tasks.exceptions.ReturnValueNotJSON"
    assert "cannot be stored as JSON" in stored.errors[0].traceback


def test_the_queue_index_is_trimmed_once_a_second_not_by_every_enqueue(jobs, redis):
    """ids older than RESULT_TTL leave the queue's index (results.ids) at the first enqueue, then at most
    once a second per process: the trim is not paid by every enqueue."""
    index = results.index_key("default")
    results._index_kept.clear()
    old_ms = int((time.time() - 8 * 86400) * 1000)  # past the default RESULT_TTL (a week)
    redis.zadd(index, {"expired1": old_ms})
    first = jobs.add.enqueue(1, 1)
    members = redis.zrange(index, 0, -1)
    assert "expired1" not in members and first.id in members and redis.ttl(index) > 0
    redis.zadd(index, {"expired2": old_ms})
    second = jobs.add.enqueue(2, 2)
    assert {"expired2", first.id, second.id} <= set(redis.zrange(index, 0, -1))  # within the second: kept for now
    results._index_kept.clear()  # as if a second went by
    third = jobs.add.enqueue(3, 3)
    members = redis.zrange(index, 0, -1)
    assert "expired2" not in members and {first.id, second.id, third.id} <= set(members)


def test_a_results_index_of_another_type_refuses_the_batch_with_nothing_written(jobs, redis):
    # The enqueue script checks every stream and index before its first write: no message whose
    # result could not be indexed, no result without its message.
    redis.set("shoal:tasks:{default}:results", "not a sorted set")
    with pytest.raises(EnqueueManyError) as caught:
        enqueue_many(jobs.add, [((1,), {"b": 2}), ((3,), {"b": 4})])
    assert caught.value.enqueued == []
    assert not redis.exists("tasks:default") and not redis.keys("shoal:task:*")
