"""Reading the backlog from XINFO GROUPS on a real Redis, including Redis 7's null lag."""
import pytest


from streams_app.redis.lag import GroupLag, estimate_lag, group_lag

pytestmark = pytest.mark.both_redis


def fill(redis, n, stream="jobs"):
    return [redis.xadd(stream, {"payload": "{}"}) for _ in range(n)]


def test_lag_as_redis_reports_it(redis):
    fill(redis, 10)
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "c", {"jobs": ">"}, count=3)
    assert group_lag(redis, "jobs", "a") == GroupLag("jobs", "a", 7, estimated=False)


def test_null_lag_is_estimated_never_taken_for_zero(redis):
    ids = fill(redis, 10)
    redis.xgroup_create("jobs", "a", id="0")
    redis.xreadgroup("a", "c", {"jobs": ">"}, count=3)
    redis.xdel("jobs", ids[5])  # an unread entry deleted: Redis 7 can no longer count the lag
    assert [g["lag"] for g in redis.xinfo_groups("jobs")] == [None]
    lag = group_lag(redis, "jobs", "a")
    assert (lag.lag, lag.estimated) == (6, True)


def test_estimate_is_capped(redis):
    fill(redis, 50)
    assert estimate_lag(redis, "jobs", "0-0", cap=20) == 20
    ids = fill(redis, 5)
    assert estimate_lag(redis, "jobs", ids[1], cap=20) == 3


def test_missing_stream_has_no_backlog_and_missing_group_will_read_the_whole_stream(redis):
    assert group_lag(redis, "nothing", "a").lag == 0
    fill(redis, 4)
    assert group_lag(redis, "jobs", "a", start="0") == GroupLag("jobs", "a", 4, estimated=True)
    assert group_lag(redis, "jobs", "a", start="$").lag == 0


def test_works_with_a_client_that_does_not_decode(redis_server):
    raw = redis_server.client(decode_responses=False)
    raw.xadd("jobs", {"payload": "{}"})
    raw.xgroup_create("jobs", "a", id="0")
    assert group_lag(raw, "jobs", "a").lag == 1
