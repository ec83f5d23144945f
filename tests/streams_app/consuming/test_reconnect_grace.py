"""Right after a reconnect a consumer judges nobody dead for one CONSUMER_TTL, from the very pass that
gets through: every deadline lapsed while Redis was away, and the others may not be back yet."""
import time


from streams_app.consuming import liveness
from tests.streams_app.consuming.loops import make_loop  # noqa: F401  (fixture)
from tests.waiting import wait_for


def _ghost_holding(redis, count):
    """``count`` entries pending for consumer ``ghost``, whose liveness deadline has lapsed and who
    has no connection: known dead."""
    ids = [redis.xadd("jobs", {"payload": "{}"}) for _ in range(count)]
    redis.xreadgroup("a", "ghost", {"jobs": ">"})
    liveness.beat(redis, ["jobs"], "ghost", 1)
    wait_for(lambda: "ghost" in liveness.dead_consumers(redis, "jobs"), what="ghost's deadline lapsed")
    return ids


def _held_by_ghost(redis):
    return {c["name"]: c["pending"] for c in redis.xpending("jobs", "a")["consumers"]}.get("ghost", 0)


def test_the_pass_that_gets_through_after_an_outage_takes_nothing_over_as_dead(
        redis, net_proxy, use_redis, make_loop):
    use_redis(net_proxy)
    loop = make_loop(CLAIM_INTERVAL_MS=1, CONSUMER_TTL=15.0, RETRY_BACKOFF=0.01)
    for _ in range(3):
        loop.step()  # ready, reading, nothing to take over
    assert loop.failures == 0
    _ghost_holding(redis, 3)

    net_proxy.refuse()
    net_proxy.cut()
    loop.step()
    assert loop.failures >= 1  # the outage, as the loop met it
    net_proxy.heal()
    deadline = time.monotonic() + 15
    while loop.failures:
        assert time.monotonic() < deadline, "the loop did not get through after the heal"
        loop.step()
        assert _held_by_ghost(redis) == 3, "taken over in the pass that noticed the reconnect"
    for _ in range(3):
        loop.step()
    assert _held_by_ghost(redis) == 3 and not loop.in_flight


def test_without_an_outage_a_dead_consumers_entries_are_taken_over_at_once(redis, make_loop):
    # The other side of the rule: the grace is the reconnect's, not a delay of every takeover.
    loop = make_loop(CLAIM_INTERVAL_MS=1, CONSUMER_TTL=15.0, RETRY_BACKOFF=0.01)
    for _ in range(3):
        loop.step()
    _ghost_holding(redis, 3)
    deadline = time.monotonic() + 10
    while _held_by_ghost(redis):
        assert time.monotonic() < deadline, "the dead consumer's entries were not taken over"
        loop.step()


def test_a_dead_consumer_whose_name_is_not_utf8_has_its_entries_taken_over(redis_server, redis, make_loop):
    # Another client read the group under raw bytes and recorded a liveness deadline under them.
    raw = redis_server.client(decode_responses=False)
    loop = make_loop(CLAIM_INTERVAL_MS=1, CONSUMER_TTL=15.0, RETRY_BACKOFF=0.01)
    for _ in range(3):
        loop.step()
    ids = [redis.xadd("jobs", {"payload": "{}"}) for _ in range(3)]
    raw.xreadgroup("a", b"\xffghost", {"jobs": ">"})
    liveness.beat(raw, ["jobs"], b"\xffghost", 1)
    wait_for(lambda: "\\xffghost" in liveness.dead_consumers(raw, "jobs"), what="the ghost's deadline lapsed")

    def held():
        return {c["name"]: c["pending"] for c in raw.xpending("jobs", "a")["consumers"]}.get(b"\xffghost", 0)

    deadline = time.monotonic() + 10
    while held():
        assert time.monotonic() < deadline, "the dead consumer's entries were not taken over"
        loop.step()
    assert {r["message_id"].decode() for r in raw.xpending_range("jobs", "a", "-", "+", 10)} <= set(ids)
    assert loop.failures == 0
