"""The backlog after a failover on Redis before 7.4: a promoted replica's XINFO GROUPS lag is too high.

A replica that full-syncs while a group is being read keeps the ``entries-read`` of its sync (the
group's reads reach it as XCLAIM ... LASTID, which leaves the counter alone; redis/redis#10569,
fixed in 7.4). Promoted, it reports a lag too high by the entries read since, for good. Set up
here with two real servers and REPLICAOF, then REPLICAOF NO ONE (what a failover does).
"""
import pytest

from streams_app import publish_many
from streams_app.admin import mirror
from streams_app.redis.connection import get_connection
from streams_app.metrics import consumer as metrics
from streams_app.conf import get_settings
from streams_app.models import ConsumerGroup, GroupSnapshot
from streams_app.operations.reclaim import Reclaimer
from streams_app.registry import select
from streams_app.redis.lag import GroupLag, checked_lag, group_lag, lag_is_trusted
from tests.waiting import wait_for

UNREAD = 5


def read_everything(client):
    for _, entries in client.xreadgroup("a", "c", {"jobs": ">"}, count=10_000) or ():
        client.xack("jobs", "a", *[entry for entry, _ in entries])


def traffic(client, n):
    for i in range(n):
        client.xadd("jobs", {"payload": "{}"})
        if i % 10 == 9:
            read_everything(client)
    read_everything(client)


@pytest.fixture
def promoted(redis_factory, use_redis):
    """A former replica, promoted, whose group has UNREAD entries left and whose lag says 1000 more."""
    master, replica = redis_factory(), redis_factory()
    primary, former = master.client(), replica.client()
    primary.xgroup_create("jobs", "a", id="0", mkstream=True)
    traffic(primary, 1000)
    former.replicaof("127.0.0.1", master.port)  # a full sync, mid-traffic
    wait_for(lambda: former.info("replication").get("master_link_status") == "up", timeout=30, what="the full sync")
    traffic(primary, 1000)
    for _ in range(UNREAD):
        primary.xadd("jobs", {"payload": "{}"})
    offset = primary.info("replication")["master_repl_offset"]
    wait_for(lambda: former.info("replication").get("slave_repl_offset", 0) >= offset, timeout=30,
             what="the replica to catch up")
    former.replicaof("no", "one")  # the failover
    if lag_is_trusted(former, "jobs"):
        pytest.skip("this Redis (>= 7.4) keeps entries-read right on a replica")
    assert former.xinfo_groups("jobs")[0]["lag"] == UNREAD + 1000  # the bug this guards against
    use_redis(replica)
    return former


def test_the_backlog_of_a_promoted_replica_is_counted_not_its_lag(promoted):
    assert group_lag(get_connection(), "jobs", "a") == GroupLag("jobs", "a", UNREAD, estimated=True)


def test_the_backlog_metric_and_lag_of_a_promoted_replica_are_the_real_backlog(promoted):
    families = {f.name: f for f in metrics.BacklogCollector(select(["jobs:a"])).collect()}
    [backlog] = families["shoal_group_backlog"].samples
    assert (backlog.value, backlog.labels["estimated"]) == (UNREAD, "true")
    [lag] = families["shoal_group_lag"].samples
    assert lag.value == UNREAD


@pytest.mark.django_db
def test_the_admin_shows_the_real_backlog_of_a_promoted_replica(promoted):
    mirror.sync_all()
    group = ConsumerGroup.objects.get(stream__name="jobs", name="a")
    assert (group.lag, group.lag_estimated) == (UNREAD, True)


@pytest.mark.django_db
def test_the_reclaimers_snapshot_of_a_promoted_replica_records_the_real_backlog(promoted):
    # The snapshots draw the admin's lag chart.
    daemon = Reclaimer(select(["jobs:a"]), conn=get_connection(), config={**get_settings(), "SNAPSHOT_INTERVAL": 3600})
    assert daemon.tick().snapshots == 1
    assert GroupSnapshot.objects.get(stream="jobs", group="a").lag == UNREAD


@pytest.mark.both_redis
def test_a_right_lag_is_kept_and_a_count_past_the_cap_uses_the_length(redis_server, redis):
    conn = get_connection()
    if not lag_is_trusted(conn, "jobs"):  # the node's version, asked of the node holding the stream
        publish_many("jobs", [{"n": n} for n in range(5)])
        redis.xgroup_create("jobs", "a", id="0")
        redis.xreadgroup("a", "c", {"jobs": ">"}, count=2)
        assert group_lag(conn, "jobs", "a") == GroupLag("jobs", "a", 3)  # checked, and right
        redis.delete("jobs")
    ids = [redis.xadd("jobs", {"payload": "{}"}) for _ in range(30)]
    # 30 entries, 10 delivered: the lag 20 is right, and a lag of 25 is 5 too many.
    assert checked_lag(redis, "jobs", ids[9], 20) == 20
    assert checked_lag(redis, "jobs", ids[9], 25) == 20
    # Past the cap on the undelivered side, the delivered side is counted and taken from XLEN.
    assert checked_lag(redis, "jobs", ids[9], 25, cap=12) == 20
    # Both sides past the cap: the lag stands, bounded by the length.
    assert checked_lag(redis, "jobs", ids[9], 25, cap=4) == 25
    assert checked_lag(redis, "jobs", ids[9], 99, cap=4) == 30
    assert checked_lag(redis, "jobs", "0-0", 99) == 30


def test_a_user_that_may_not_run_info_gets_the_lag_checked(redis_factory):
    import redis as redis_py

    server = redis_factory()
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "shoal", "on", ">pw", "~*", "&*", "-@all", "+@stream", "+@connection",
                          "-@dangerous")
    user = redis_py.Redis(port=server.port, username="shoal", password="pw", decode_responses=True)
    with pytest.raises(redis_py.exceptions.NoPermissionError):
        user.info("server")
    for _ in range(5):
        user.xadd("jobs", {"payload": "{}"})
    user.xgroup_create("jobs", "a", id="0")
    user.xreadgroup("a", "c", {"jobs": ">"}, count=2)
    assert not lag_is_trusted(user, "jobs")  # unknown version: counted rather than trusted
    assert group_lag(user, "jobs", "a") == GroupLag("jobs", "a", 3)
