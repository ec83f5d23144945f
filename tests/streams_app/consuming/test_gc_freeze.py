"""A consumer process moves what its start-up made out of the cyclic collector's reach (gc.freeze), single and
pooled: the collector then scans only the messages' short-lived objects (bench/README.md, issue 36)."""
import json
import signal

import pytest

from tests.waiting import wait_for


@pytest.mark.parametrize("args", [(), ("--workers", "1")], ids=["single", "pooled"])
def test_a_handler_runs_with_start_up_frozen(redis, run_consumer, args):
    consumer = run_consumer("gcfrozen:g", *args)
    redis.xadd("gcfrozen", {"payload": json.dumps({"n": 1})})
    wait_for(lambda: redis.llen("gc:frozen") == 1, timeout=60, what="the handler ran")
    # Django and the apps alone are tens of thousands of objects; an unfrozen process reports 0.
    assert int(redis.lindex("gc:frozen", 0)) > 10_000
    consumer.signal(signal.SIGTERM)
    assert consumer.wait(30) == 0
