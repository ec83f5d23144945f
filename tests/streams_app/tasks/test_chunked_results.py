"""The sync queue handler (QueueHandler) writes a task's SUCCESSFUL together with the start of the
next task its thread runs, and the chunk's last one before run_chunk returns: one round trip per task,
and no entry is acked before its result is SUCCESSFUL. On one redis-server (on a cluster the two
results are in different slots, and each write is its own round trip: test_backend.py)."""
import pytest
import redis as redis_py

from streams_app.consuming.chunks import run_chunk
from streams_app.publishing.message import Message
from streams_app.tasks import results
from streams_app.tasks.api import task_finished, task_started
from streams_app.tasks.runner import QueueHandler

# run_chunk closes the thread's stale database connections, as in a worker: a test before this one may have
# opened one, and pytest-django refuses database access to a test without this mark.
pytestmark = pytest.mark.django_db


def delivered(redis, stream="tasks:default"):
    return [Message(entry_id, stream, "workers", fields, deliveries=1, consumer="worker-1")
            for entry_id, fields in redis.xrange(stream)]


@pytest.fixture
def events():
    got = []

    def receiver(signal, sender, task_result, **kwargs):
        got.append((task_result.args[0], task_result.status))

    for signal in (task_started, task_finished):
        signal.connect(receiver, weak=False)
    yield got
    for signal in (task_started, task_finished):
        signal.disconnect(receiver)


@pytest.fixture
def at_maxmemory(redis):
    """Redis refusing every write (scripts included) until the test ends."""
    def refuse():
        redis.config_set("maxmemory-policy", "noeviction")
        redis.config_set("maxmemory", "1")

    yield refuse
    redis.config_set("maxmemory", "0")


def test_a_chunk_ends_with_every_result_successful_in_one_round_trip_per_task(jobs, redis, events):
    for _ in range(2):  # a warm-up chunk loads the three scripts (a first EVALSHA is refused, then loaded)
        jobs.add.enqueue(-1, 0)
    run_chunk(QueueHandler("default"), delivered(redis))
    events.clear()
    ids = [jobs.add.enqueue(n, 1).id for n in range(3)]
    redis.config_resetstat()
    outcome = run_chunk(QueueHandler("default"), delivered(redis)[2:])
    assert [stored.status for stored in map(jobs.add.get_result, ids)] == ["SUCCESSFUL"] * 3
    assert [jobs.add.get_result(i).return_value for i in ids] == [1, 2, 3]
    assert len(outcome.acked) == 3 and not outcome.failed
    # Django's order: each task's task_finished before the next one's task_started.
    assert events == [(0, "RUNNING"), (0, "SUCCESSFUL"), (1, "RUNNING"), (1, "SUCCESSFUL"),
                      (2, "RUNNING"), (2, "SUCCESSFUL")]
    calls = {name: stats["calls"] for name, stats in redis.info("commandstats").items()}
    assert calls.get("cmdstat_evalsha", 0) + calls.get("cmdstat_eval", 0) == 3 + 1  # 3 starts, the last end
    assert "cmdstat_multi" not in calls


def test_a_success_whose_write_with_the_next_start_fails_is_not_acked(jobs, redis, at_maxmemory):
    first, second = jobs.add.enqueue(1, 1), jobs.add.enqueue(2, 2)
    handler = QueueHandler("default")
    one, two = delivered(redis)
    handler(one)  # ran; its SUCCESSFUL waits for the next start
    at_maxmemory()
    with pytest.raises(redis_py.ResponseError, match="maxmemory"):
        handler(two)
    [(lost, exc)] = handler.end_chunk()
    assert lost is one and "maxmemory" in str(exc)
    assert results.get(redis, first.id)["status"] == "RUNNING"  # not acked: run again, then SUCCESSFUL
    assert results.get(redis, second.id)["status"] == "READY"


def test_the_chunks_last_success_that_cannot_be_written_is_a_failure_not_an_ack(jobs, redis, at_maxmemory):
    result = jobs.add.enqueue(1, 1)
    handler = QueueHandler("default")
    [message] = delivered(redis)
    handler(message)
    at_maxmemory()
    [(lost, exc)] = handler.end_chunk()
    assert lost is message and "maxmemory" in str(exc)
    assert results.get(redis, result.id)["status"] == "RUNNING"
    assert handler.end_chunk() == []  # written or lost once, never twice
