"""runconsumer --burst: handles what the stream holds, then exits 0 (tests, batch jobs)."""
import json

from streams_app import publish, publish_many


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
