"""Partitioned streams (STREAMS["PARTITIONS"]): routing, reading every partition, dead letters, lag, layout changes."""
import json
from collections import Counter

import pytest
from redis.cluster import RedisCluster

from streams_app import publish, publish_many
from streams_app.partitioning import partitions
from streams_app.redis.connection import get_connection
from streams_app.deadletters.replay import replay
from streams_app.exceptions import PartitionConfigError
from streams_app.redis.keys import dead_letter_key
from streams_app.metrics.consumer import BacklogCollector
from streams_app.registry import select
from streams_app.redis.lag import read_lags
from tests.streams_app.consuming.loops import make_loop, run_until  # noqa: F401  (make_loop is a fixture)
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis

N = 6


@pytest.fixture
def partitioned(settings, redis):
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": N}}
    return partitions.names("orders")


def handled(redis, names, group="p"):
    return [entry for name in names for entry in redis.lrange(f"handled:{name}:{group}", 0, -1)]


def test_partition_names_are_derived_stable_and_spread_over_the_slot_space(partitioned):
    assert len(set(partitioned)) == N and all(name.startswith("orders:") for name in partitioned)
    assert partitions.names("orders") == [partitions.partition_name("orders", i, N) for i in range(N)]
    slots = [partitions._slot(name) for name in partitioned]
    assert all(i * 16384 // N <= slot < (i + 1) * 16384 // N for i, slot in enumerate(slots))
    assert partitions.names("jobs") == ["jobs"]  # not declared: not partitioned


def test_on_a_cluster_the_partitions_spread_over_every_master(partitioned, redis_kind):
    conn = get_connection()
    if redis_kind == "single":
        assert not isinstance(conn, RedisCluster)
        return
    owners = Counter(conn.get_node_from_key(name).name for name in partitioned)
    assert len(owners) == 3 and set(owners.values()) == {2}


def test_a_key_goes_to_the_same_partition_every_time_by_crc32(partitioned, redis):
    # zlib.crc32 of the key's UTF-8 bytes mod N: the same in every process and language.
    for key, index in [("customer-1", 3), ("customer-2", 3), ("customer-42", 5)]:
        entry = publish("orders", {"k": key}, key=key)
        assert redis.xrange(partitioned[index], min=entry, max=entry), f"{key} not in partition {index}"
    ids = publish_many("orders", [{"n": n} for n in range(12)], keys=["customer-42"] * 12)
    assert [e[0] for e in redis.xrange(partitioned[5])][-12:] == ids  # per-key order kept in its partition


def test_without_a_key_messages_go_round_robin(partitioned, redis):
    publish_many("orders", [{"n": n} for n in range(2 * N)])
    assert [redis.xlen(name) for name in partitioned] == [2] * N
    for n in range(N):
        publish("orders", {"n": n})
    assert [redis.xlen(name) for name in partitioned] == [3] * N


def test_publish_many_returns_ids_in_input_order_across_partitions(partitioned, redis):
    keys = [f"k{n}" for n in range(300)]
    ids = publish_many("orders", [{"n": n} for n in range(300)], keys=keys)
    for n in (0, 17, 299):
        [(entry, fields)] = redis.xrange(partitioned[partitions.index_for_key(keys[n], N)], min=ids[n], max=ids[n])
        assert json.loads(fields["payload"]) == {"n": n}
    assert sum(redis.xlen(name) for name in partitioned) == 300


def test_the_layout_is_recorded_and_changing_the_count_of_a_stream_with_entries_is_refused(partitioned, redis, settings):
    publish("orders", {"n": 1}, key="a")
    assert json.loads(redis.get("{orders}:partitions")) == partitioned
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 3}}
    with pytest.raises(PartitionConfigError, match="declare a new stream name"):
        publish("orders", {"n": 2}, key="a")
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {}}
    from streams_app.consuming.worker import Worker

    with pytest.raises(PartitionConfigError, match="6 partition"):
        Worker(select(["orders:p"])).check_partitions(get_connection())


def test_an_empty_stream_may_change_its_count(partitioned, redis, settings):
    partitions.ensure_recorded(get_connection(), "orders")
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 3}}
    publish("orders", {"n": 1}, key="a")
    assert json.loads(redis.get("{orders}:partitions")) == partitions.names("orders", 3)


def test_a_plain_stream_with_entries_cannot_become_partitioned(redis, settings):
    publish("orders", {"n": 1})
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": N}}
    with pytest.raises(PartitionConfigError, match="'orders' still hold"):
        publish("orders", {"n": 2})


def test_a_partitioned_stream_with_entries_cannot_become_plain(partitioned, redis, settings):
    """Dropped from STREAMS["PARTITIONS"]: publishing to the plain stream would strand the messages."""
    from django.core.management import CommandError, call_command

    publish("orders", {"n": 1}, key="a")
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {}}
    with pytest.raises(PartitionConfigError, match=r"no longer declares it.*Put \{'orders': 6\} back"):
        publish("orders", {"n": 2}, key="a")
    with pytest.raises(PartitionConfigError, match="no longer declares it"):
        publish_many("orders", [{"n": 3}])
    with pytest.raises(CommandError, match="nothing was published: stream 'orders' has 6 partition.s. recorded in Redis"):
        call_command("publish", "orders", '{"n": 4}')
    assert not redis.exists("orders")
    # The count changed: a clean CommandError as well, not a traceback.
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 3}}
    with pytest.raises(CommandError, match="nothing was published: .*now declares 3"):
        call_command("publish", "orders", '{"n": 5}')
    # Once the old partitions are drained (here: deleted), the stream may become plain.
    redis.delete(*partitioned)
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {}}
    publish("orders", {"n": 6})
    assert redis.xlen("orders") == 1 and not redis.exists("{orders}:partitions")


def test_a_consumer_reads_every_partition_and_the_lag_is_summed(partitioned, redis, make_loop):
    specs = select(["orders:p"])
    assert [spec.stream for spec in specs] == partitioned and {spec.logical for spec in specs} == {"orders"}
    assert select([f"{partitioned[2]}:p"]) == [specs[2]]  # one partition only
    ids = publish_many("orders", [{"n": n} for n in range(60)], keys=[f"c{n % 7}" for n in range(60)])
    lags = read_lags(get_connection(), specs)
    assert sum(lag.lag for lag in lags) == 60
    loops = [make_loop(f"{name}:p") for name in partitioned]
    run_until(loops, lambda: len(handled(redis, partitioned)) == 60)
    assert sorted(handled(redis, partitioned)) == sorted(ids)
    assert sum(lag.lag for lag in read_lags(get_connection(), specs)) == 0


def test_dead_letters_stay_in_their_partition_and_replay_puts_them_back_there(partitioned, redis, make_loop):
    entry = publish("orders", {"fail": "always"}, key="customer-42")
    home = partitioned[5]
    loops = [make_loop(f"{name}:p") for name in partitioned]
    run_until(loops, lambda: redis.xlen(dead_letter_key(home)) == 1)
    [(letter_id, letter)] = redis.xrange(dead_letter_key(home))
    assert letter["shoal:origin_id"] == entry and letter["shoal:origin_stream"] == home
    result = replay("orders", "p", ids=[letter_id])
    assert [i for i, _ in result.replayed] == [letter_id] and not result.skipped
    [(new_id, fields)] = redis.xrange(home, min="(" + entry, max="+")
    assert fields["shoal:replay_of"] == entry and fields["shoal:target_group"] == "p"
    assert replay("orders", "p", ids=["1-1"]).skipped == {"1-1": "missing"}


def test_the_backlog_metric_names_the_logical_stream_and_partition(partitioned, redis):
    publish_many("orders", [{"n": n} for n in range(N)])
    for name in partitioned:
        redis.xgroup_create(name, "p", id="0")
    extra = [redis.xadd(partitioned[2], {"payload": "{}"}) for _ in range(3)]
    redis.xreadgroup("p", "c", {partitioned[2]: ">"}, count=1)
    redis.xdel(partitioned[2], extra[1])  # an unread entry deleted: Redis 7 can no longer count the lag
    publish("orders", {"n": "more"}, key="customer-1")  # partition 3
    [backlog] = [m for m in BacklogCollector(select(["orders:p"])).collect() if m.name == "shoal_group_backlog"]
    samples = {(s.labels["partition"], s.labels["estimated"]): s.value for s in backlog.samples}
    assert {s.labels["logical_stream"] for s in backlog.samples} == {"orders"}
    assert samples[("3", "false")] == 2 and samples[("0", "false")] == 1
    assert samples[("2", "true")] == 2  # estimated from the last-delivered id: 2 entries left to deliver


def test_pending_lag_and_dead_letters_name_the_logical_stream_and_partition_too(partitioned, redis):
    for name in partitioned:
        redis.xgroup_create(name, "p", id="0", mkstream=True)
    publish_many("orders", [{"n": n} for n in range(4 * N)])  # round-robin: 4 in each partition
    for name in partitioned:
        redis.xreadgroup("p", "c", {name: ">"}, count=1)
    redis.xadd(dead_letter_key(partitioned[1]), {"payload": "{}"})
    families = {m.name: m for m in BacklogCollector(select(["orders:p"])).collect()}
    for family in ("shoal_group_pending", "shoal_group_lag", "shoal_group_lag_estimated", "shoal_dead_letters"):
        samples = families[family].samples
        assert {(s.labels["stream"], s.labels["logical_stream"], s.labels["partition"]) for s in samples} == {
            (name, "orders", str(i)) for i, name in enumerate(partitioned)}, family
    # What a dashboard sums by logical_stream: the whole stream's figures.
    assert sum(s.value for s in families["shoal_group_pending"].samples) == N
    assert sum(s.value for s in families["shoal_group_lag"].samples) == 3 * N
    assert {s.labels["partition"]: s.value for s in families["shoal_dead_letters"].samples}["1"] == 1


@pytest.mark.slow
def test_runconsumer_on_the_logical_stream_reads_every_partition_exactly_once(partitioned, redis, run_consumer):
    streams = {"PARTITIONS": {"orders": N}, "CLAIM_INTERVAL_MS": 200}
    first = run_consumer("orders:p", "--threads", "2", streams=streams)
    second = run_consumer("orders:p", "--threads", "2", streams=streams)
    ids = publish_many("orders", [{"n": n} for n in range(240)], keys=[f"customer-{n % 13}" for n in range(240)])
    wait_for(lambda: len(handled(redis, partitioned)) >= 240, timeout=60, what="240 handled")
    assert sorted(handled(redis, partitioned)) == sorted(ids)  # every one, none twice
    for proc in (first, second):
        assert proc.proc.poll() is None, proc.output()


def test_the_documented_removal_of_an_old_stream_deletes_its_keys_and_no_others(partitioned, redis, make_loop):
    """docs/cluster.md "Removing the old stream": the snippet, run as written."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "docs" / "cluster.md").read_text()
    [code] = re.findall(r"python manage.py shell -c '\n(.*?)\n'\n```", text, re.S)
    publish_many("orders", [{"fail": "always"}] * 3 + [{"n": n} for n in range(20)], keys=[f"k{n}" for n in range(23)])
    publish("orders-v2", {"n": 1})
    loops = [make_loop(f"{name}:p") for name in partitioned]
    run_until(loops, lambda: sum(redis.xlen(dead_letter_key(name)) for name in partitioned) == 3)
    assert redis.exists("{orders}:partitions")
    exec(code, {})
    left = [name for name in partitioned if redis.exists(name) or redis.exists(dead_letter_key(name))]
    assert left == [] and not redis.exists("{orders}:partitions")
    if not isinstance(get_connection(), RedisCluster):  # one server: nothing of orders is left at all
        left = [k for k in redis.scan_iter(match="*orders*") if "orders-v2" not in k
                and not k.startswith(("handled:", "started:"))]  # the test handler's own records
        assert left == []
    assert redis.xlen("orders-v2") == 1
