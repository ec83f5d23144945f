"""Deferred messages in one process: publish(..., run_after=...), the scheduled set, the move script,
the consumers' Mover and the reclaim daemon's backstop (streams_app/publishing/scheduled.py)."""
import io
import json
import logging
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from redis.cluster import RedisCluster
from django.core.management import CommandError, call_command

from streams_app import publish, publish_many
from streams_app.partitioning import partitions
from streams_app.publishing import scheduled
from streams_app.redis.connection import get_connection, node_client
from streams_app.exceptions import PartialPublishError, PublishError
from streams_app.redis.keys import scheduled_data_key, scheduled_key
from streams_app.publishing.message import Message
from streams_app.operations.reclaim import Reclaimer
from streams_app.registry import select
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis

SCHEDULED_ID = re.compile(r"^\d{13}-\d{12}-[0-9a-f]{12}$")


def redis_ms(key):
    """The Redis clock, in ms, on the node that holds ``key`` (TIME there, as the scripts read it)."""
    seconds, micros = node_client(get_connection(), key).time()
    return int(seconds) * 1000 + int(micros) // 1000


def all_keys(redis):
    """Every key on the test's Redis: on a cluster, of every master (KEYS on one client asks one node)."""
    if isinstance(redis, RedisCluster):
        return sorted(redis.keys("*", target_nodes=RedisCluster.PRIMARIES))
    return sorted(redis.keys("*"))


def move_until_moved(stream, count=1, timeout=10):
    """Run the move script until ``count`` messages have moved (what a consumer's Mover does)."""
    moved = []

    def step():
        moved.append(scheduled.move_due(get_connection(), stream).moved)
        return sum(moved) >= count

    wait_for(step, timeout=timeout, interval=0.01, what=f"{count} deferred messages of {stream} moved")
    return sum(moved)


def test_a_deferred_message_waits_in_the_scheduled_set_until_due_then_moves_once(redis):
    before = redis_ms("jobs")
    scheduled_id = publish("jobs", {"n": 1}, key="k1", headers={"trace": "t"}, run_after=timedelta(milliseconds=400))
    assert SCHEDULED_ID.match(scheduled_id), scheduled_id
    assert redis.xlen("jobs") == 0
    [(member, due)] = redis.zrange(scheduled_key("jobs"), 0, -1, withscores=True)
    assert member == scheduled_id and before + 400 <= due <= redis_ms("jobs") + 400
    assert redis.hexists(scheduled_data_key("jobs"), scheduled_id)
    early = scheduled.move_due(get_connection(), "jobs")
    assert early.moved == 0 and 0 < early.next_in_ms <= 400, early  # and says when to look again
    assert move_until_moved("jobs") == 1
    [(entry_id, fields)] = redis.xrange("jobs")
    assert int(entry_id.split("-")[0]) >= int(due), "moved before it was due (both on the Redis clock)"
    assert json.loads(fields["payload"]) == {"n": 1} and fields["key"] == "k1"
    assert json.loads(fields["headers"]) == {"trace": "t"}
    assert fields["shoal:scheduled_id"] == scheduled_id and int(fields["shoal:run_after"]) == int(due)
    assert not redis.exists(scheduled_key("jobs"), scheduled_data_key("jobs"))
    assert scheduled.move_due(get_connection(), "jobs") == (0, -1, "", 0)
    message = Message(entry_id, "jobs", "g", {k.encode(): v.encode() for k, v in fields.items()})
    assert message.scheduled_id == scheduled_id and message.run_after == int(due)
    assert Message(entry_id, "jobs", "g", {b"payload": b"{}"}).run_after is None


def test_an_aware_datetime_is_an_instant_and_one_in_the_past_is_due_at_once(redis):
    at = datetime.now(timezone(timedelta(hours=-5))) + timedelta(hours=1)
    publish("jobs", {"n": 1}, run_after=at)
    [(_, due)] = redis.zrange(scheduled_key("jobs"), 0, -1, withscores=True)
    assert due == int(-(-at.timestamp() * 1000 // 1))  # to the ms, rounded up: never before the time asked
    publish("later", {"n": 2}, run_after=datetime(2001, 1, 1, tzinfo=UTC))
    assert scheduled.move_due(get_connection(), "later").moved == 1
    assert scheduled.move_due(get_connection(), "jobs").moved == 0


def test_publish_many_defers_every_message_and_they_move_in_publish_order(redis):
    ids = publish_many("jobs", [{"n": n} for n in range(250)], keys=[f"k{n}" for n in range(250)],
                       run_after=timedelta(0))
    assert len(ids) == len(set(ids)) == 250 and all(SCHEDULED_ID.match(i) for i in ids)
    assert redis.zcard(scheduled_key("jobs")) == 250 and redis.xlen("jobs") == 0
    assert scheduled.move_due(get_connection(), "jobs").moved == 100  # SCHEDULED_BATCH per call
    moved, last = scheduled.move_all_due(get_connection(), "jobs")
    assert moved == 150 and last.next_in_ms == -1
    entries = redis.xrange("jobs")
    assert [f["shoal:scheduled_id"] for _, f in entries] == ids
    assert [json.loads(f["payload"])["n"] for _, f in entries] == list(range(250))


def test_maxlen_applies_when_the_message_reaches_its_stream(redis):
    publish_many("capped", [{"n": n} for n in range(20)])
    publish_many("capped", [{"n": n} for n in range(20, 1020)], maxlen=100, run_after=timedelta(0))
    assert redis.xlen("capped") == 20  # scheduling trims nothing
    scheduled.move_all_due(get_connection(), "capped")
    assert 100 <= redis.xlen("capped") <= 300
    assert json.loads(redis.xrange("capped")[-1][1]["payload"]) == {"n": 1019}


def test_a_partitioned_stream_defers_into_the_partition_of_the_key_and_keeps_that_keys_order(redis, settings):
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 6}}
    target = partitions.route("orders", "customer-7")
    publish("orders", {"step": 1}, key="customer-7")
    first = publish("orders", {"step": 2}, key="customer-7", run_after=timedelta(0))
    publish("orders", {"step": 3}, key="customer-7")
    assert redis.zcard(scheduled_key(target)) == 1
    assert all(not redis.exists(scheduled_key(name)) for name in partitions.names("orders") if name != target)
    assert not redis.exists(scheduled_key("orders"))  # never the logical name's: no consumer moves that one
    scheduled.move_all_due(get_connection(), target)
    # A deferred message joins its key's partition when it is moved: after what was published meanwhile.
    assert [json.loads(f["payload"])["step"] for _, f in redis.xrange(target)] == [1, 3, 2]
    ids = publish_many("orders", [{"n": n} for n in range(60)], keys=[f"c{n % 7}" for n in range(60)],
                       run_after=timedelta(0))
    for name in partitions.names("orders"):
        scheduled.move_all_due(get_connection(), name)
    moved = {f["shoal:scheduled_id"]: (name, f["key"]) for name in partitions.names("orders")
             for _, f in redis.xrange(name) if "shoal:scheduled_id" in f}
    assert set(moved) == {first, *ids}
    assert all(name == partitions.route("orders", key) for name, key in moved.values())


BAD = [
    (datetime(2030, 1, 1), "must be an aware datetime, not the naive 2030-01-01T00:00:00"),
    (timedelta(seconds=-1), "must not be a negative timedelta"),
    (timedelta(days=400), "beyond STREAMS['RUN_AFTER_MAX'] (31,622,400 s)"),
    (datetime.now(UTC) + timedelta(days=400), "beyond STREAMS['RUN_AFTER_MAX']"),
    (5, "must be an aware datetime or a timedelta, not int 5 (for seconds from now, pass timedelta(seconds=...))"),
    (float("nan"), "not float nan"),
    ("2030-01-01T00:00:00Z", "not str"),
    (True, "not bool"),
]


@pytest.mark.parametrize("run_after, message", BAD)
def test_bad_run_after_is_refused_with_nothing_stored(redis, run_after, message):
    with pytest.raises(PublishError, match=re.escape(message)):
        publish("jobs", {"n": 1}, run_after=run_after)
    with pytest.raises(PublishError, match=re.escape(message)):
        publish_many("jobs", [{"n": 1}, {"n": 2}], run_after=run_after)
    with pytest.raises(PublishError, match=re.escape(message)):
        publish("jobs", {"n": 1}, run_after=run_after, outbox=True)  # refused before any SQL
    assert all_keys(redis) == []


def test_a_bad_message_or_a_pipeline_is_refused_with_nothing_stored(redis):
    with pytest.raises(PublishError, match="message 1: payload"):
        publish_many("jobs", [{"n": 1}, {"bad": {1}}], run_after=timedelta(0))
    with pytest.raises(PublishError, match="run_after= cannot be used with pipeline="):
        publish("jobs", {"n": 1}, run_after=timedelta(0), pipeline=get_connection().pipeline())
    assert all_keys(redis) == []


@pytest.mark.parametrize("key, kind", [("jobs", "string"), ("{jobs}:scheduled", "sorted set of deferred messages"),
                                       ("{jobs}:scheduled:data", "hash of deferred messages' fields")])
def test_a_key_of_another_type_is_named_and_left_alone(redis, key, kind):
    redis.set(key, "precious")
    with pytest.raises(PublishError, match=re.escape(f"Redis key {key!r} holds a string, not the ")):
        publish("jobs", {"n": 1}, run_after=timedelta(0))
    with pytest.raises(PublishError, match="nothing was published"):
        publish_many("jobs", [{"n": 1}], run_after=timedelta(0))
    assert redis.get(key) == "precious" and all_keys(redis) == [key]


def test_settings_bound_the_delay(redis, settings):
    settings.STREAMS = {**settings.STREAMS, "RUN_AFTER_MAX": 60}
    publish("jobs", {"n": 1}, run_after=timedelta(seconds=60))
    with pytest.raises(PublishError, match=r"61 s ahead, beyond STREAMS\['RUN_AFTER_MAX'\] \(60 s\)"):
        publish("jobs", {"n": 1}, run_after=timedelta(seconds=61))


def test_a_redis_failure_part_way_says_which_were_scheduled(redis, settings, monkeypatch):
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 3}}
    names = partitions.names("orders")
    keys = [next(f"k{n}" for n in range(100) if partitions.route("orders", f"k{n}") == name) for name in names]
    redis.set(scheduled_key(names[1]), "precious")  # the second partition's script is refused
    with pytest.raises(PartialPublishError) as caught:
        publish_many("orders", [{"n": n} for n in range(3)], keys=keys, run_after=timedelta(0))
    assert len(caught.value.ids) == 1 and caught.value.in_doubt == 0
    assert redis.zrange(scheduled_key(names[0]), 0, -1) == caught.value.ids
    assert not redis.exists(scheduled_key(names[2]))


# -- who moves ---------------------------------------------------------------------------------

def test_the_mover_moves_every_stream_it_reads_and_waits_for_the_next_head(redis):
    publish("jobs", {"n": 1}, run_after=timedelta(0))
    publish("ledger", {"n": 2}, run_after=timedelta(0))
    publish("ledger", {"n": 3}, run_after=timedelta(seconds=30))
    mover = scheduled.Mover(["jobs", "ledger"], clock=lambda: 100.0)
    assert mover.tick() == 2
    assert redis.xlen("jobs") == 1 and redis.xlen("ledger") == 1
    assert mover.due["jobs"] == 101.0  # nothing left: the poll interval
    assert mover.due["ledger"] == 101.0  # 30 s ahead: looked at again after one interval anyway
    assert mover.tick(now=100.5) == 0  # neither stream's time has come: no call at all
    publish("jobs", {"n": 4}, run_after=timedelta(milliseconds=300))
    assert mover.tick(now=101.0) == 0
    assert 100.9 <= mover.due["jobs"] <= 101.3 and mover.wait(now=101.0) <= 0.3  # woken for the head


def _calls(redis, command):
    return redis.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def test_an_idle_pass_over_many_streams_is_one_exists_on_one_server(redis):
    if isinstance(redis, RedisCluster):
        pytest.skip("on a cluster each scheduled set is in a slot of its own: one script per stream, as before")
    streams = [f"q{n}" for n in range(6)]
    mover = scheduled.Mover(streams, clock=lambda: 0.0)
    assert mover.tick(now=0) == 0  # the first pass runs each stream's script: types and ACL checked
    scripts_before, exists_before = _calls(redis, "evalsha"), _calls(redis, "exists")
    assert mover.tick(now=1) == 0 and mover.tick(now=2) == 0
    assert _calls(redis, "evalsha") == scripts_before  # no script call (and no ZCARD) per stream
    assert _calls(redis, "exists") == exists_before + 2  # one EXISTS per pass for all six
    assert all(at == 3.0 for at in mover.due.values())
    publish("q4", {"n": 1}, run_after=timedelta(0))
    assert mover.tick(now=3) == 1 and redis.xlen("q4") == 1  # something is scheduled: the scripts run


def test_a_stream_key_of_another_type_stops_its_moves_and_is_logged_once(redis, caplog):
    publish("jobs", {"n": 1}, run_after=timedelta(0))
    redis.set("jobs", "precious")
    mover = scheduled.Mover(["jobs"], name="c1")
    with caplog.at_level(logging.WARNING, logger="streams_app.scheduled"):
        for now in (0, 10, 20):
            assert mover.tick(now=now) == 0
    warnings = [r.getMessage() for r in caplog.records if "could not move" in r.getMessage()]
    assert len(warnings) == 1 and "Redis key 'jobs' holds a string, not a stream" in warnings[0], warnings
    assert redis.zcard(scheduled_key("jobs")) == 1 and redis.get("jobs") == "precious"
    redis.delete("jobs")
    assert mover.tick(now=30) == 1


@pytest.mark.django_db
def test_the_reclaim_daemon_moves_what_is_due_as_a_backstop(redis):
    publish_many("jobs", [{"n": n} for n in range(150)], run_after=timedelta(0))
    publish("jobs", {"n": "later"}, run_after=timedelta(seconds=60))
    report = Reclaimer(select(["jobs:a"]), conn=get_connection()).tick()
    assert report.scheduled_moved == {"jobs": 150} and redis.xlen("jobs") == 150
    assert redis.zcard(scheduled_key("jobs")) == 1


@pytest.mark.django_db
def test_the_reclaim_daemon_names_a_scheduled_set_of_another_type_and_leaves_it(redis):
    redis.set(scheduled_key("jobs"), "precious")
    report = Reclaimer(select(["jobs:a"]), conn=get_connection()).tick()
    assert any("Redis key '{jobs}:scheduled' holds a string, not a zset" in error for error in report.errors), report.errors
    assert redis.get(scheduled_key("jobs")) == "precious"


def test_a_partition_count_change_is_refused_while_deferred_messages_wait_in_a_dropped_partition(redis, settings):
    from streams_app.exceptions import PartitionConfigError

    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 3}}
    publish("orders", {"n": 1}, key="c1", run_after=timedelta(hours=1))
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 2}}
    # Consumers of the new layout would never read (nor move) the old partitions: the message would be stranded.
    with pytest.raises(PartitionConfigError, match="still hold 1 entries or deferred messages"):
        publish("orders", {"n": 2}, key="c1")


# -- the command ------------------------------------------------------------------------------------

def test_the_publish_command_defers_with_delay_or_run_after(redis, monkeypatch):
    out = io.StringIO()
    call_command("publish", "jobs", '{"n": 1}', "--delay", "2.5", stdout=out)
    call_command("publish", "jobs", '{"n": 2}', "--run-after", "2000-01-01T00:00:00+00:00", stdout=out)
    first, second = out.getvalue().split()
    assert SCHEDULED_ID.match(first) and SCHEDULED_ID.match(second)
    assert redis.zcard(scheduled_key("jobs")) == 2 and redis.xlen("jobs") == 0
    assert scheduled.move_due(get_connection(), "jobs").moved == 1  # the one in 2000
    monkeypatch.setattr("sys.stdin", io.StringIO('{"n": 3}\n{"n": 4}\n'))
    call_command("publish", "jobs", "-", "--delay", "0", stdout=out)
    assert redis.zcard(scheduled_key("jobs")) == 3


@pytest.mark.parametrize("args, message", [
    (["--delay", "-1"], "--delay must be a number of seconds, 0 or more, not '-1'"),
    (["--delay", "nan"], "--delay must be a number of seconds, 0 or more, not 'nan'"),
    (["--delay", "soon"], "--delay must be a number of seconds, 0 or more, not 'soon'"),
    (["--run-after", "tomorrow"], "--run-after must be an ISO 8601 time with its UTC offset"),
    (["--run-after", "2030-01-01T00:00:00"], "--run-after must be an ISO 8601 time with its UTC offset"),
    (["--delay", "1e9"], "beyond STREAMS['RUN_AFTER_MAX']"),
    (["--delay", "1", "--run-after", "2030-01-01T00:00:00Z"], "give --delay or --run-after, not both"),
])
def test_the_publish_command_refuses_a_bad_time_with_nothing_published(redis, args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("publish", "jobs", '{"n": 1}', *args)
    assert all_keys(redis) == []


# -- the control room --------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_admin_shows_how_many_deferred_messages_each_stream_holds(redis, settings, admin_client):
    from streams_app.admin import mirror
    from streams_app.models import Stream

    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"orders": 3}}
    publish_many("jobs", [{"n": n} for n in range(4)], run_after=timedelta(hours=1))
    publish("jobs", {"n": 5})
    publish_many("orders", [{"n": n} for n in range(9)], keys=[f"c{n}" for n in range(9)], run_after=timedelta(hours=1))
    redis.set(scheduled_key("ledger"), "not a sorted set")  # counted as none, the page still shows
    mirror.sync_all()
    jobs = Stream.objects.get(name="jobs")
    assert (jobs.length, jobs.scheduled) == (1, 4)
    assert sum(Stream.objects.get(name=name).scheduled for name in partitions.names("orders")) == 9
    assert Stream.objects.get(name="ledger").scheduled == 0
    assert '<td class="field-scheduled">4</td>' in admin_client.get("/admin/streams_app/stream/").content.decode()
    page = admin_client.get("/admin/streams_app/stream/logical/?name=orders").content.decode()
    assert "9 deferred messages waiting for their time" in page


# -- replicas ---------------------------------------------------------------------------------------

def test_with_replicas_a_deferred_publish_returns_once_the_replica_has_it(redis_factory, use_redis):
    """A master and a replica of its own (started here: it runs once, not per kind of Redis)."""
    from streams_app.exceptions import NotReplicatedError

    master, replica = redis_factory(), redis_factory()
    copy = replica.client()
    copy.replicaof("127.0.0.1", master.port)
    wait_for(lambda: copy.info("replication").get("master_link_status") == "up", timeout=30, what="the replica")
    use_redis(master)
    one = publish("jobs", {"n": 1}, run_after=timedelta(hours=1), replicas=1, replicas_timeout_ms=4000)
    many = publish_many("jobs", [{"n": n} for n in range(1500)], run_after=timedelta(hours=1), replicas=1,
                        replicas_timeout_ms=4000)
    assert copy.zscore(scheduled_key("jobs"), one) is not None and copy.zcard(scheduled_key("jobs")) == 1501
    assert copy.hlen(scheduled_data_key("jobs")) == 1501 and many[-1] in copy.zrange(scheduled_key("jobs"), -1, -1)
    copy.replicaof("no", "one")  # the replica is gone: nobody confirms
    with pytest.raises(NotReplicatedError, match="only 0 of 1 replica") as caught:
        publish("jobs", {"n": 2}, run_after=timedelta(hours=1), replicas=1, replicas_timeout_ms=200)
    assert master.client().zscore(scheduled_key("jobs"), caught.value.id) is not None  # stored on the master
    with pytest.raises(PublishError, match="replicas_timeout_ms .* must be at most"):
        publish("jobs", {"n": 3}, run_after=timedelta(0), replicas=1, replicas_timeout_ms=10**7)


# -- a Redis user without sorted-set commands (an ACL from before deferred messages) -------------------

OLD_ACL = ["on", ">s3cret", "~*", "&*", "-@all", "+@stream", "+@scripting", "+@string", "+@hash", "+@set",
           "+@keyspace", "+@pubsub", "+@connection", "+time", "-@dangerous", "+@list"]


@pytest.mark.django_db
def test_without_sorted_set_commands_a_deferred_publish_says_what_to_grant_and_the_rest_works(
        redis_factory, settings, caplog):
    server = redis_factory()
    server.client().execute_command("ACL", "SETUSER", "shoal", *OLD_ACL)
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"],
                                                      "LOCATION": f"redis://shoal:s3cret@127.0.0.1:{server.port}/0"}}
    with pytest.raises(PublishError, match=re.escape("grant it +@sortedset (docs/operations.md")):
        publish("jobs", {"n": 1}, run_after=timedelta(0))
    with pytest.raises(PublishError, match="nothing was published"):
        publish_many("jobs", [{"n": 1}], run_after=timedelta(0))
    publish("jobs", {"n": 2})  # a direct publish is as before
    mover = scheduled.Mover(["jobs", "ledger"], name="c1")
    with caplog.at_level(logging.WARNING):
        assert mover.tick(now=0) == 0 and mover.tick(now=120) == 0
        daemon = Reclaimer(select(["jobs:a"]), conn=get_connection())
        report = daemon.tick()
        daemon.tick()
    said = [r.getMessage() for r in caplog.records if "deferred messages are not moved" in r.getMessage()]
    assert len(said) == 2, said  # once by the mover, once by the reclaimer, however many passes
    assert mover.due["jobs"] == 120 + scheduled.FORBIDDEN_RETRY
    assert not [error for error in report.errors if "sorted" in error or "script" in error], report.errors
    assert server.client().xlen("jobs") == 1
