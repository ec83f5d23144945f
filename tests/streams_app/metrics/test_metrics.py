"""Consumer metrics: recorded per chunk by run_chunk, and the backlog read from Redis at scrape time."""
import json
import signal
import urllib.request

import pytest

from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest

from streams_app import publish_many

from streams_app.metrics import consumer as metrics
from streams_app.consuming.chunks import run_chunk
from streams_app.publishing.message import Message
from streams_app.registry import select
from tests.redis_server import free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis


def value(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def message(n, payload):
    body = payload if isinstance(payload, str) else json.dumps(payload)
    return Message(f"1-{n}", "metrics-test", "g", {b"payload": body.encode()}, 1, "me")


def failing_on_request(message):
    if message.payload.get("fail"):
        raise RuntimeError("asked to")


@pytest.mark.django_db  # run_chunk closes stale database connections
def test_run_chunk_counts_handled_failed_and_poison_and_times_every_entry():
    labels = {"stream": "metrics-test", "group": "g"}
    before = {
        "handled": value("shoal_messages_handled_total", **labels),
        "error": value("shoal_messages_failed_total", reason="error", **labels),
        "poison": value("shoal_messages_failed_total", reason="poison", **labels),
        "count": value("shoal_handler_duration_seconds_count", **labels),
    }
    chunk = [message(1, {}), message(2, {"fail": 1}), message(3, "{not json"), message(4, {})]

    result = run_chunk(failing_on_request, chunk)

    assert result.acked == ["1-1", "1-4"] and len(result.failed) == 2
    assert value("shoal_messages_handled_total", **labels) - before["handled"] == 2
    assert value("shoal_messages_failed_total", reason="error", **labels) - before["error"] == 1
    assert value("shoal_messages_failed_total", reason="poison", **labels) - before["poison"] == 1
    assert value("shoal_handler_duration_seconds_count", **labels) - before["count"] == 4
    assert value("shoal_messages_in_flight", **labels) == 0


def test_observe_many_of_one_value_matches_observe():
    registry = CollectorRegistry()
    ours = Histogram("ours", "h", buckets=metrics.DURATION_BUCKETS, registry=registry)
    theirs = Histogram("theirs", "h", buckets=metrics.DURATION_BUCKETS, registry=registry)
    for seconds in (0.00005, 0.001, 0.003, 0.5, 61.0, 0.01):
        metrics.observe_many(ours, 1, seconds)
        theirs.observe(seconds)
    metrics.observe_many(ours, 4, 0.02)  # four entries of 5 ms each
    for _ in range(4):
        theirs.observe(0.005)
    exposed = generate_latest(registry).decode().splitlines()

    def samples(prefix):
        pairs = (line.rsplit(" ", 1) for line in exposed if line.startswith(prefix + "_") and "_created" not in line)
        return {name[len(prefix):]: float(number) for name, number in pairs}

    assert samples("ours") == pytest.approx(samples("theirs"))
    assert len(samples("ours")) == len(metrics.DURATION_BUCKETS) + 3  # +Inf, _count, _sum


def test_backlog_collector_reports_lag_pending_and_dead_letters(redis):
    publish_many("jobs", [{"n": n} for n in range(5)])
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "c1", {"jobs": ">"}, count=2)
    redis.xadd("{jobs}:dlq", {"payload": "{}"})
    specs = select(["jobs:a", "queue:order-processing:workers"])

    families = {family.name: family for family in metrics.BacklogCollector(specs).collect()}

    samples = {(f.name, tuple(s.labels.values())): s.value for f in families.values() for s in f.samples}
    # stream, logical_stream, partition ("" : not partitioned), group
    assert samples[("shoal_group_lag", ("jobs", "jobs", "", "a"))] == 3
    assert samples[("shoal_group_pending", ("jobs", "jobs", "", "a"))] == 2
    assert samples[("shoal_dead_letters", ("jobs", "jobs", ""))] == 1
    assert samples[("shoal_backlog_scrape_ok", ())] == 1
    assert not any(labels == ("queue:order-processing", "workers") for _, labels in samples)  # no stream yet


def test_backlog_collector_flags_a_key_of_another_type_and_reports_the_rest(redis):
    # Issue 33, item 8: shoal_dead_letters vanished for the stream, with scrape_ok 1 and nothing to say why.
    publish_many("jobs", [{"n": 1}])
    redis.xgroup_create("jobs", "a", id="0")
    redis.set("{jobs}:dlq", "not a stream")
    redis.set("queue:order-processing", "not a stream either")
    specs = select(["jobs:a", "queue:order-processing:workers"])

    families = {family.name: family for family in metrics.BacklogCollector(specs).collect()}

    samples = {(f.name, tuple(s.labels.values())): s.value for f in families.values() for s in f.samples}
    assert samples[("shoal_group_lag", ("jobs", "jobs", "", "a"))] == 1  # what can be read is reported
    assert not [labels for name, labels in samples if name == "shoal_dead_letters" and labels[0] == "jobs"]
    assert samples[("shoal_key_wrong_type", ("jobs", "jobs", "", "{jobs}:dlq", "string"))] == 1
    assert samples[("shoal_key_wrong_type", ("queue:order-processing", "queue:order-processing", "",
                                             "queue:order-processing", "string"))] == 1
    assert samples[("shoal_backlog_scrape_ok", ())] == 1  # Redis answered; the key is what is wrong
    redis.delete("{jobs}:dlq", "queue:order-processing")
    families = {family.name: family for family in metrics.BacklogCollector(specs).collect()}
    assert families["shoal_key_wrong_type"].samples == []  # always exposed, so absent() alerts have a name


def test_backlog_collector_says_when_redis_is_down(redis_factory, use_redis):
    server = redis_factory()
    use_redis(server)
    server.stop()
    families = metrics.BacklogCollector(select(["jobs:a"])).collect()
    assert [(f.name, f.samples[0].value) for f in families] == [("shoal_backlog_scrape_ok", 0)]


@pytest.mark.django_db
def test_consumer_metrics_server_serves_the_process_metrics(redis):
    port = free_port()
    server, thread = metrics.start_metrics_server(port, addr="127.0.0.1")
    try:
        run_chunk(failing_on_request, [message(9, {})])
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
        REGISTRY.unregister(next(c for c in list(REGISTRY._collector_to_names) if isinstance(c, metrics.BacklogCollector)))
    assert 'shoal_messages_handled_total{group="g",stream="metrics-test"}' in body
    assert "shoal_backlog_scrape_ok 1.0" in body


def test_backlog_collector_with_no_groups_still_says_when_redis_is_down(redis_factory, use_redis):
    # Issue 34 (round 3, F5): with nothing registered the scrape sent no command at all and said
    # scrape_ok 1 whatever Redis did.
    server = redis_factory()
    use_redis(server)
    collector = metrics.BacklogCollector([])
    assert scrape_ok(collector) == 1
    server.stop()
    assert scrape_ok(collector) == 0


def test_backlog_collector_with_no_groups_says_when_redis_is_frozen(redis_factory, use_redis):
    from shoal_common.redisconn import dedicated_connection
    from streams_app.redis.connection import get_connection

    server = redis_factory()
    use_redis(server)
    conn = dedicated_connection(get_connection(), socket_timeout=0.5, socket_connect_timeout=0.5)
    collector = metrics.BacklogCollector([], connection=lambda: conn)
    assert scrape_ok(collector) == 1
    server.process.send_signal(signal.SIGSTOP)  # hung: the kernel accepts, nothing answers
    try:
        families = collector.collect()
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert [f.name for f in families] == ["shoal_backlog_scrape_ok"] and families[0].samples[0].value == 0
    wait_for(lambda: scrape_ok(collector) == 1,
             timeout=15, what="scrape_ok 1 once Redis answers again")


def scrape_ok(collector):
    [family] = [f for f in collector.collect() if f.name == "shoal_backlog_scrape_ok"]
    return family.samples[0].value
