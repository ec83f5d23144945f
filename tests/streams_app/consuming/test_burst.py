"""runconsumer --burst: handles what the stream holds, then exits 0 (tests, batch jobs)."""
import json

from streams_app import publish, publish_many
from tests.waiting import wait_for


def test_burst_handles_what_is_there_and_exits_0(redis, run_consumer):
    ids = publish_many("jobs", [{"n": n} for n in range(20)])
    proc = run_consumer("jobs:a", "--burst", "--threads", "4")
    assert proc.wait(timeout=60) == 0, proc.output()
    assert sorted(redis.lrange("handled:jobs:a", 0, -1)) == sorted(ids)
    assert redis.xpending("jobs", "a")["pending"] == 0  # every one acked before the exit
    assert redis.llen("handled:jobs:b") == 0  # only the group selected


def test_burst_on_an_empty_stream_exits_at_once(redis, run_consumer):
    proc = run_consumer("jobs:a", "--burst")
    assert proc.wait(timeout=60) == 0, proc.output()


def test_a_failed_entry_stays_pending_for_its_retry_and_the_burst_still_ends(redis, run_consumer):
    streams = {"RETRY_BACKOFF": 30}
    failing = publish("jobs", {"fail": "boom"})
    ok = publish("jobs", {"n": 1})
    proc = run_consumer("jobs:a", "--burst", streams=streams)
    assert proc.wait(timeout=60) == 0, proc.output()
    assert redis.lrange("handled:jobs:a", 0, -1) == [ok]
    pending = redis.xpending_range("jobs", "a", "-", "+", 10)
    assert [p["message_id"] for p in pending] == [failing]


def test_burst_refuses_a_pool_and_ordered_consumers(redis, run_consumer):
    pool = run_consumer("jobs:a", "--burst", "--workers", "2")
    assert pool.wait(timeout=60) == 3 and "--burst runs one process" in pool.output()
    ordered = run_consumer("ordered:o", "--burst", streams=json.loads('{"PARTITIONS": {"ordered": 2}}'))
    assert ordered.wait(timeout=60) == 3 and "does not run ordered=True consumers" in ordered.output()


def test_burst_handles_what_a_handler_publishes_to_another_group_that_already_read_nothing(redis, run_consumer):
    # chain2's loop reads nothing within milliseconds; chain1's handler publishes to it half a second later.
    publish("chain1", {"sleep": 0.5})
    proc = run_consumer("chain1:c", "chain2:c", "--burst")
    assert proc.wait(timeout=60) == 0, proc.output()
    assert redis.llen("handled:chain2:c") == 1, proc.output()
    assert redis.xpending("chain2", "c")["pending"] == 0


def test_a_burst_that_never_runs_out_gives_up_after_its_timeout_and_exits_4(redis, run_consumer):
    publish("selffeed", {"n": 0})
    proc = run_consumer("selffeed:g", "--burst", "--burst-timeout", "1")
    assert proc.wait(timeout=60) == 4, proc.output()
    assert "--burst gave up after --burst-timeout 1s with work left" in proc.output()


def test_a_burst_with_redis_unreachable_gives_up_and_exits_4(redis_factory, run_consumer):
    server = redis_factory()
    server.stop()
    proc = run_consumer("jobs:a", "--burst", "--burst-timeout", "1", server=server)
    assert proc.wait(timeout=60) == 4, proc.output()
    assert "--burst gave up: Redis unreachable for 1s at start" in proc.output()


def test_a_burst_that_loses_redis_midway_gives_up_and_exits_4(redis_factory, use_redis, run_consumer):
    server = redis_factory()
    use_redis(server)
    publish("jobs", {"sleep": 1})
    proc = run_consumer("jobs:a", "--burst", "--burst-timeout", "30", "--shutdown-timeout", "1", server=server)
    wait_for(lambda: server.client().llen("started:jobs:a") == 1, what="the handler running")
    server.stop()
    assert proc.wait(timeout=60) == 4, proc.output()
    assert "--burst gave up: Redis unreachable for 10s" in proc.output()


def test_burst_timeout_needs_burst(redis, run_consumer):
    proc = run_consumer("jobs:a", "--burst-timeout", "5")
    assert proc.wait(timeout=60) == 3 and "--burst-timeout needs --burst" in proc.output()
