"""The reclaim daemon's pass, step by step, against a real Redis (in this process)."""
import threading
import time

import pytest
import redis as redis_lib
from redis.backoff import NoBackoff
from redis.retry import Retry
from prometheus_client import REGISTRY

from streams_app import publish_many
from streams_app.conf import get_settings
from streams_app.deadletters import store as deadletters
from streams_app.redis.keys import running_key
from streams_app.redis.connection import get_connection, node_client
from streams_app.models import GroupSnapshot
from streams_app.operations.reclaim import Reclaimer
from streams_app.registry import select
from tests.waiting import wait_for
from datetime import UTC

pytestmark = [pytest.mark.django_db, pytest.mark.both_redis]  # a pass ends with snapshots, stored in the database


def reclaimer(selectors, **overrides):
    return Reclaimer(select(selectors), conn=get_connection(), config={**get_settings(), **overrides})


def abandon(redis, stream, group, ids, deliveries, idle_ms=60_000, consumer="ghost"):
    """Make ``ids`` pending for a consumer that died, with the given delivery count and idle time."""
    try:
        redis.xgroup_create(stream, group, id="0")
    except Exception:
        pass
    redis.xreadgroup(group, consumer, {stream: ">"})
    pipe = redis.pipeline(transaction=False)
    for start in range(0, len(ids), 200):
        pipe.xclaim(stream, group, consumer, 0, ids[start : start + 200], idle=idle_ms, retrycount=deliveries, justid=True)
    pipe.execute()


def test_audit_dead_letters_idle_entries_at_the_limit_with_their_last_error(redis):
    ids = publish_many("jobs", [{"n": n} for n in range(4)])
    abandon(redis, "jobs", "a", ids, deliveries=5)
    redis.xclaim("jobs", "a", "ghost", 0, [ids[1]], idle=60_000, retrycount=4)  # one below the limit
    redis.xclaim("jobs", "a", "busy", 0, [ids[2]], retrycount=5)  # at the limit, but being handled now
    redis.hset(f"{{jobs}}:error:a:{ids[0]}", mapping={"error": "KeyError: 'sku'", "traceback": "Traceback ..."})
    report = reclaimer(["jobs:a"], PENDING_TIMEOUT_MS=1000).tick()
    assert report.dead_lettered == {"jobs:a": 2}
    letters = {f["shoal:origin_id"]: f for _, f in redis.xrange("{jobs}:dlq")}
    assert set(letters) == {ids[0], ids[3]}
    assert letters[ids[0]]["shoal:error"] == "KeyError: 'sku'" and letters[ids[0]]["shoal:traceback"] == "Traceback ..."
    assert letters[ids[3]]["shoal:error"].startswith("no handler error recorded: delivered 5 times")
    assert letters[ids[3]]["shoal:deliveries"] == "5" and letters[ids[3]]["shoal:consumer"] == "ghost"
    assert {p["message_id"] for p in redis.xpending_range("jobs", "a", "-", "+", 10)} == {ids[1], ids[2]}


def test_two_reclaimers_racing_in_threads_move_each_entry_once(redis):
    ids = publish_many("jobs", [{"n": n} for n in range(1000)])
    abandon(redis, "jobs", "a", ids, deliveries=9)
    daemons = [reclaimer(["jobs:a"]) for _ in range(2)]
    start = threading.Barrier(2)
    reports = [None, None]

    def run(index):
        from streams_app.operations.reclaim import PassReport

        reports[index] = PassReport()
        start.wait()
        daemons[index].audit(daemons[index].specs[0], reports[index])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    moved = [r.dead_lettered.get("jobs:a", 0) for r in reports]
    assert sum(moved) == 1000, moved
    origins = [f["shoal:origin_id"] for _, f in redis.xrange("{jobs}:dlq")]
    assert len(origins) == 1000 and set(origins) == set(ids)
    assert redis.xpending("jobs", "a")["pending"] == 0


def test_idle_consumers_without_pending_entries_are_removed_and_holders_kept(redis):
    ids = publish_many("jobs", [{"n": n} for n in range(2)])
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "holder", {"jobs": ">"}, count=1)
    redis.xreadgroup("a", "finished", {"jobs": ">"}, count=1)
    redis.xack("jobs", "a", ids[1])
    redis.hset("{jobs}:consumers", mapping={"finished": 1, "holder": 1})  # both long dead
    for name in ("finished", "holder"):  # their run ledgers' records (consuming/runs.py)
        redis.hset(running_key("jobs", "a", name), mapping={"-": "", ids[0]: ids[0]})
    daemon = reclaimer(["jobs:a"], DEAD_CONSUMER_IDLE=3600)
    assert daemon.tick().consumers_removed == {}  # nobody idle for an hour
    daemon.config["DEAD_CONSUMER_IDLE"] = 0.05
    removed = wait_for(lambda: daemon.tick().consumers_removed, timeout=5, what="the idle consumer removed")
    assert removed == {"jobs:a": ["finished"]}
    assert redis.hkeys("{jobs}:consumers") == ["holder"]  # its liveness record went with it
    # And its running record: it names nothing pending (before, each process start left one for a week).
    assert not redis.exists(running_key("jobs", "a", "finished")) and redis.exists(running_key("jobs", "a", "holder"))
    time.sleep(0.1)
    daemon.tick()
    assert [c["name"] for c in redis.xinfo_consumers("jobs", "a")] == ["holder"]  # it holds an entry: kept
    assert redis.xpending("jobs", "a")["pending"] == 1


def test_safe_trimming_never_drops_what_a_lagging_group_has_not_acked(redis):
    ids = publish_many("ledger", [{"n": n} for n in range(100)])
    redis.xgroup_create("ledger", "fast", id="0")
    redis.xgroup_create("ledger", "slow", id="0")
    [[_, fast]] = redis.xreadgroup("fast", "f", {"ledger": ">"})
    redis.xack("ledger", "fast", *[i for i, _ in fast])
    [[_, slow]] = redis.xreadgroup("slow", "s", {"ledger": ">"}, count=50)
    acked = [i for i, _ in slow][:20] + [i for i, _ in slow][30:40]  # a gap: 20..29 still pending
    redis.xack("ledger", "slow", *acked)
    daemon = reclaimer(["ledger:fast", "ledger:slow"])
    report = daemon.tick()
    assert report.trimmed == {"ledger": 20}
    left = [i for i, _ in redis.xrange("ledger")]
    assert left == ids[20:]  # entry 30..39 are acked by both but sit above a pending one: kept
    for entry in ids[20:30] + ids[50:]:  # pending in slow, or never read by it
        assert entry in left
    assert daemon.tick().trimmed == {}  # nothing more is safe
    redis.xack("ledger", "slow", *ids[20:30], *ids[40:50])
    assert daemon.tick().trimmed == {"ledger": 30}  # up to what slow has read
    assert [i for i, _ in redis.xrange("ledger")] == ids[50:]


def test_trimming_is_only_for_streams_with_acked_retention_and_read_groups(redis):
    publish_many("jobs", [{"n": n} for n in range(10)])
    redis.xgroup_create("jobs", "a", id="0")
    [[_, got]] = redis.xreadgroup("a", "c", {"jobs": ">"})
    redis.xack("jobs", "a", *[i for i, _ in got])
    assert reclaimer(["jobs:a"]).tick().trimmed == {}  # jobs has no retention="acked"
    assert redis.xlen("jobs") == 10
    publish_many("ledger", [{"n": n} for n in range(10)])
    assert reclaimer(["ledger:fast"]).tick().trimmed == {}  # no group has read anything yet
    assert redis.xlen("ledger") == 10


def test_snapshots_rows_gauges_and_pruning(redis):
    ids = publish_many("jobs", [{"n": n} for n in range(10)])
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "c", {"jobs": ">"}, count=4)
    redis.xgroup_create("jobs", "b", id="$")
    failed = publish_many("jobs", [{"n": n} for n in range(3)])
    deadletters.move(redis, "jobs", "a", [(ids[0], "ValueError: x", "")])
    redis.xreadgroup("b", "c", {"jobs": ">"})
    deadletters.move(redis, "jobs", "b", [(i, "ValueError: x", "") for i in failed[1:]])
    daemon = reclaimer(["jobs:a", "jobs:b"], SNAPSHOT_INTERVAL=3600, SNAPSHOT_RETENTION=60)
    now = time.time()
    old = GroupSnapshot.objects.create(stream="jobs", group="a", taken_at=_utc(now - 120), lag=0, pending=0,
                                       consumers=0, dead_letters=0)
    assert daemon.tick(now=now).snapshots == 2
    row = GroupSnapshot.objects.get(taken_at=_utc(now), group="a")
    assert (row.lag, row.pending, row.consumers, row.dead_letters) == (9, 3, 1, 1)
    # The dead-letter stream holds both groups' letters; each group's row counts its own.
    assert GroupSnapshot.objects.get(taken_at=_utc(now), group="b").dead_letters == 2
    assert not GroupSnapshot.objects.filter(pk=old.pk).exists()  # older than the retention
    other = reclaimer(["jobs:a", "jobs:b"], SNAPSHOT_INTERVAL=3600)
    assert other.tick(now=now + 1).snapshots == 0  # one row per interval, however many daemons
    labels = {"stream": "jobs", "group": "a"}
    assert REGISTRY.get_sample_value("shoal_group_consumers", labels) == 1
    assert len(ids) == 10


def _utc(seconds):
    from datetime import datetime

    return datetime.fromtimestamp(seconds, UTC)


def test_a_stop_request_finishes_the_current_pass_and_returns(redis):
    ids = publish_many("jobs", [{"n": n} for n in range(3)])
    abandon(redis, "jobs", "a", ids, deliveries=5)
    daemon = reclaimer(["jobs:a"], RECLAIM_INTERVAL=3600)
    daemon.stop.set()  # what SIGTERM does (runreclaimer's handler only sets this flag)
    started = time.monotonic()
    daemon.run()
    assert daemon.passes == 1 and redis.xlen("{jobs}:dlq") == 3  # the pass ran to its end
    assert time.monotonic() - started < 60  # and did not wait out the hour-long interval


def test_no_trimming_while_a_declared_group_does_not_exist_yet(redis):
    # ledger:slow is declared in code (start="0") but its consumers never ran: it will read the
    # whole stream when they do, so everything fast has acked must stay.
    ids = publish_many("ledger", [{"n": n} for n in range(10)])
    redis.xgroup_create("ledger", "fast", id="0")
    [[_, got]] = redis.xreadgroup("fast", "f", {"ledger": ">"})
    redis.xack("ledger", "fast", *[i for i, _ in got])
    assert reclaimer(["ledger:fast"]).tick().trimmed == {}
    assert [i for i, _ in redis.xrange("ledger")] == ids


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(redis_factory, use_redis, caplog):
    server = redis_factory()
    use_redis(server)  # the mirror's copies go down with it
    specs = select(["jobs:a", "failing:g"])
    reclaim = Reclaimer(specs, conn=redis_lib.Redis(port=server.port, socket_timeout=2, retry=Retry(NoBackoff(), 0)), config={**get_settings()})
    reclaim.tick()
    server.stop()
    caplog.clear()
    with caplog.at_level("INFO", logger="streams_app"):
        for _ in range(20):
            assert reclaim.tick().errors
        down = [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
        assert len(down) == 1 and "unreachable" in down[0].getMessage(), [r.getMessage() for r in down]
        server.start()
        caplog.clear()
        assert not reclaim.tick().errors
        assert reclaim.tick().errors == []
        back = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(back) == 1 and "reachable again" in back[0], back


def test_liveness_of_a_consumer_no_group_knows_is_forgotten_once_long_lapsed(redis):
    # A worker SIGKILLed before its first entry: a deadline in {jobs}:consumers, no consumer in the group.
    publish_many("jobs", [{"n": 1}])
    redis.xgroup_create("jobs", "a", id="0")
    now_ms = int(redis.time()[0]) * 1000
    redis.hset("{jobs}:consumers", mapping={"never-read": now_ms - 120_000, "lapsed-just-now": now_ms - 1_000,
                                             "alive": now_ms + 15_000})
    reclaimer(["jobs:a"], DEAD_CONSUMER_IDLE=60.0).tick()
    assert set(redis.hkeys("{jobs}:consumers")) == {"lapsed-just-now", "alive"}


def test_a_pass_at_maxmemory_defers_what_redis_refuses_and_finishes_it_later(redis):
    """noeviction at maxmemory: the dead-letter XADD and the snapshot key are refused; the pass ends
    with errors instead of raising, the entries stay pending, and the next pass with room moves them."""
    ids = publish_many("jobs", [{"n": n} for n in range(3)])
    abandon(redis, "jobs", "a", ids, deliveries=5)
    daemon = reclaimer(["jobs:a"], PENDING_TIMEOUT_MS=1000, SNAPSHOT_INTERVAL=0.001)
    node = node_client(redis, "jobs")  # CONFIG is per node: the one that holds the stream's slot
    node.config_set("maxmemory-policy", "noeviction")
    node.config_set("maxmemory", "1")
    try:
        report = daemon.tick()
    finally:
        node.config_set("maxmemory", "0")
    assert report.dead_lettered == {} and any("3 dead-letter moves refused" in e for e in report.errors), report
    assert redis.xpending("jobs", "a")["pending"] == 3 and redis.xlen("{jobs}:dlq") == 0
    assert daemon.tick().dead_lettered == {"jobs:a": 3}
    assert redis.xpending("jobs", "a")["pending"] == 0
