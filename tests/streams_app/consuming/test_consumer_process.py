"""``manage.py runconsumer`` as real processes: fan-out, competition, SIGKILL, SIGTERM, Redis restarts."""
import signal
from collections import Counter

import pytest

from streams_app.redis.connection import node_client
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.both_redis]


def publish_raw(client, stream, payloads):
    import json

    pipe = client.pipeline(transaction=False)
    for payload in payloads:
        pipe.xadd(stream, {"payload": json.dumps(payload)})
    return pipe.execute()


def handled(client, stream, group):
    return client.lrange(f"handled:{stream}:{group}", 0, -1)


def test_fan_out_to_groups_and_exclusive_delivery_within_one(redis, run_consumer):
    procs = [run_consumer("jobs:a"), run_consumer("jobs:a"), run_consumer("jobs:b")]
    # Publish once all three block on their reads: a consumer that starts after the first one has
    # drained the stream reads nothing, and Redis 7.0 creates no group consumer for an empty read.
    for proc in procs:
        proc.wait_for_output("started", timeout=60)
    ids = publish_raw(redis, "jobs", [{"n": n} for n in range(3000)])
    wait_for(lambda: len(handled(redis, "jobs", "a")) >= 3000 and len(handled(redis, "jobs", "b")) >= 3000,
             timeout=60, what="3000 handled in both groups")
    wait_for(lambda: redis.xpending("jobs", "a")["pending"] == 0 and redis.xpending("jobs", "b")["pending"] == 0,
             timeout=10, what="all acked")
    for group in ("a", "b"):
        counts = Counter(handled(redis, "jobs", group))
        assert set(counts) == set(ids), f"group {group} missed entries"
        assert max(counts.values()) == 1, f"group {group} handled an entry twice"
    consumers = redis.xinfo_consumers("jobs", "a")
    assert len(consumers) == 2  # both competing processes registered in the group
    for proc in procs:
        proc.signal(signal.SIGTERM)
    assert [proc.wait(30) for proc in procs] == [0, 0, 0]


def test_sigkill_mid_batch_is_taken_over_by_another_consumer(redis, run_consumer):
    streams = {"PENDING_TIMEOUT_MS": 1500, "CLAIM_INTERVAL_MS": 300}
    ids = publish_raw(redis, "jobs", [{"n": n, "sleep": 0.02} for n in range(300)])
    first = run_consumer("jobs:a", "--threads", "2", streams=streams)
    wait_for(lambda: redis.llen("handled:jobs:a") >= 20, timeout=30, what="first consumer under way")
    first.kill()
    assert redis.xpending("jobs", "a")["pending"] > 0, "the killed consumer held no unacked entries"
    run_consumer("jobs:a", "--threads", "4", streams=streams)
    wait_for(lambda: set(handled(redis, "jobs", "a")) == set(ids) and redis.xpending("jobs", "a")["pending"] == 0,
             timeout=60, what="every entry handled and acked after takeover")


def test_sigterm_finishes_in_flight_work_and_reads_nothing_more(redis, run_consumer):
    ids = publish_raw(redis, "jobs", [{"n": n, "sleep": 1.0} for n in range(4)])
    proc = run_consumer("jobs:a", "--threads", "4", "--block-ms", "5000")
    wait_for(lambda: redis.llen("started:jobs:a") == 4, timeout=30, what="4 handlers started")
    proc.signal(signal.SIGTERM)
    proc.wait_for_output("SIGTERM received")
    late = publish_raw(redis, "jobs", [{"n": n} for n in range(3)])
    assert proc.wait(30) == 0, proc.output()
    assert sorted(handled(redis, "jobs", "a")) == sorted(ids)
    assert redis.xpending("jobs", "a")["pending"] == 0
    [group] = redis.xinfo_groups("jobs")
    assert group["last-delivered-id"] == ids[-1], "entries published after SIGTERM were read"
    assert group["lag"] == len(late)
    assert redis.xinfo_consumers("jobs", "a") == [], "a clean stop left its consumer name in the group"


def test_second_signal_exits_at_once_and_loses_nothing(redis, run_consumer):
    ids = publish_raw(redis, "jobs", [{"n": n, "sleep": 30} for n in range(2)])
    proc = run_consumer("jobs:a", "--threads", "2")
    wait_for(lambda: redis.llen("started:jobs:a") == 2, timeout=30, what="handlers started")
    proc.signal(signal.SIGTERM)
    proc.wait_for_output("SIGTERM received")
    proc.signal(signal.SIGINT)
    assert proc.wait(10) == 2
    pending = {p["message_id"] for p in redis.xpending_range("jobs", "a", "-", "+", 10)}
    assert pending == set(ids)  # still pending, ready for takeover


def test_survives_a_redis_restart(redis_factory, run_consumer):
    server = redis_factory()
    client = server.client()
    proc = run_consumer("jobs:a", server=server, streams={"BLOCK_MS": 500})
    publish_raw(client, "jobs", [{"n": n} for n in range(10)])
    wait_for(lambda: client.llen("handled:jobs:a") == 10, timeout=30, what="first batch")
    server.restart(down_for=1.0)  # no persistence: the stream and its group are gone too
    client = server.client()
    ids = publish_raw(client, "jobs", [{"n": n} for n in range(10, 20)])
    wait_for(lambda: sorted(handled(client, "jobs", "a")) == sorted(ids), timeout=30, what="handled after restart")
    assert proc.proc.poll() is None
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    out = proc.output()
    assert "Redis unreachable" in out and "reachable again" in out


def test_unknown_selector_is_a_clear_error(redis, run_consumer):
    proc = run_consumer("jobs:nope")
    assert proc.wait(30) == 3
    out = proc.output()
    assert "no consumer is registered for 'jobs:nope'. Registered:" in out
    assert "Traceback" not in out


def test_stream_key_of_another_type_is_reported_and_left_alone(redis, run_consumer):
    redis.set("jobs", "precious")
    proc = run_consumer("jobs:a")
    assert proc.wait(30) == 3
    out = proc.output()
    assert "holds a string, not a stream" in out and "Traceback" not in out
    assert redis.get("jobs") == "precious"


def test_sigterm_cuts_a_blocked_read_short_so_nothing_is_read_after_it(redis, run_consumer):
    # An idle consumer sits in XREADGROUP BLOCK 20000. Without CLIENT UNBLOCK on shutdown, that read
    # would return the entry published after SIGTERM and the consumer would take it.
    proc = run_consumer("jobs:a", "--block-ms", "20000", streams={"CLAIM_INTERVAL_MS": 60_000})
    proc.wait_for_output("started")
    wait_for(lambda: any(c.get("cmd") == "xreadgroup" and c.get("name", "").startswith("shoal-reader:")
                         for c in node_client(redis, "jobs").client_list()), what="the consumer's blocked read")
    proc.signal(signal.SIGTERM)
    proc.wait_for_output("SIGTERM received")
    late = publish_raw(redis, "jobs", [{"n": 1}])
    assert proc.wait(30) == 0
    [group] = redis.xinfo_groups("jobs")
    assert group["pending"] == 0 and group["lag"] == 1, f"the entry {late} published after SIGTERM was read"


def test_a_single_consumer_serves_its_metrics(redis, run_consumer):
    import urllib.request

    from tests.redis_server import free_port

    port = free_port()
    proc = run_consumer("jobs:a", "--metrics-port", str(port))
    publish_raw(redis, "jobs", [{"n": n} for n in range(20)] + [{"fail": "x"}])
    wait_for(lambda: redis.llen("handled:jobs:a") == 20, timeout=30, what="20 handled")

    def scrape():
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()

    wait_for(lambda: 'shoal_messages_handled_total{group="a",stream="jobs"} 20.0' in scrape(), what="handled counter")
    text = scrape()
    assert 'shoal_messages_failed_total{group="a",reason="error",stream="jobs"} 1.0' in text
    # The backlog, read from Redis at scrape time: only the failed entry stays pending (acks are batched).
    wait_for(lambda: 'shoal_group_pending{group="a",logical_stream="jobs",partition="",stream="jobs"} 1.0' in scrape(), what="pending gauge at 1")
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def test_entries_of_a_consumer_known_dead_are_taken_over_before_the_pending_timeout(redis, run_consumer):
    # The pending timeout is far beyond this test; only the lapsed liveness deadline of the killed
    # consumer (CONSUMER_TTL 1.5 s) lets the second one take its entries.
    streams = {"PENDING_TIMEOUT_MS": 600_000, "CLAIM_INTERVAL_MS": 200, "CONSUMER_TTL": 1.5, "RETRY_BACKOFF": 0.1}
    ids = publish_raw(redis, "jobs", [{"n": n, "sleep": 0.05} for n in range(100)])
    first = run_consumer("jobs:a", "--threads", "2", streams=streams)
    wait_for(lambda: redis.llen("handled:jobs:a") >= 10, timeout=30, what="first consumer under way")
    first.kill()
    assert redis.xpending("jobs", "a")["pending"] > 0
    run_consumer("jobs:a", streams=streams).wait_for_output("started")
    wait_for(lambda: set(handled(redis, "jobs", "a")) == set(ids) and redis.xpending("jobs", "a")["pending"] == 0,
             timeout=60, what="the dead consumer's entries handled long before the pending timeout")


def test_a_clean_exit_is_not_taken_for_a_death(redis, run_consumer):
    proc = run_consumer("jobs:a", streams={"CONSUMER_TTL": 1.5})
    proc.wait_for_output("started")
    wait_for(lambda: redis.hlen("{jobs}:consumers") == 1, what="the liveness deadline written")
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert redis.hlen("{jobs}:consumers") == 0


def test_a_process_consuming_two_groups_reports_an_outage_once(redis_factory, run_consumer):
    # Issue 33, item 11: each group's read loop logged "Redis unreachable" and "reachable again".
    server = redis_factory()
    client = server.client()
    proc = run_consumer("jobs:a", "jobs:b", server=server, streams={"BLOCK_MS": 500})
    proc.wait_for_output("started")
    server.restart(down_for=1.0)
    client = server.client()
    ids = publish_raw(client, "jobs", [{"n": n} for n in range(5)])
    for group in ("a", "b"):
        wait_for(lambda group=group: sorted(handled(client, "jobs", group)) == sorted(ids), timeout=30,
                 what=f"{group} handled")
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    lines = [line for line in proc.output().splitlines() if "streams_app.consumer: Consumer " in line]
    assert len([line for line in lines if ": Redis unreachable (" in line]) == 1, proc.output()
    assert len([line for line in lines if ": Redis reachable again" in line]) == 1, proc.output()
