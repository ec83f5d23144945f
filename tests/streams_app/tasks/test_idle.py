"""What an idle Tasks worker asks of Redis (issue 44): its lower bands block like any read instead of asking
XINFO GROUPS and reading 20 times a second, and an empty scheduled set costs its mover one ZCARD.
bench/tasks_idle.py measures the whole of it; this counts the two commands that were the cost."""
import time

import pytest

from tests.waiting import wait_for

pytestmark = pytest.mark.django_db


def calls(redis, command):
    return redis.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def test_an_idle_worker_with_bands_neither_polls_the_bands_nor_reads_its_empty_schedules(run_workers, redis):
    run_workers("tasks:default:workers", "tasks:default:async:workers")
    wait_for(lambda: all(redis.exists(s) for s in ("tasks:default:low", "tasks:default:async:low")), timeout=60,
             what="the bands' groups made")
    time.sleep(3)  # start-up settles (the first reads find nothing)
    before = {name: calls(redis, name) for name in ("xinfo|groups", "xreadgroup", "zrangebyscore")}
    window = 4
    time.sleep(window)  # a measuring window, not a wait for a condition
    rates = {name: (calls(redis, name) - count) / window for name, count in before.items()}
    # Six read loops blocked BLOCK_MS (2 s) each: about 3 reads a second; the old short reads made 20 each.
    assert rates["xreadgroup"] < 12, rates
    assert rates["xinfo|groups"] < 2, rates  # was one per lower band's read: about 60 a second
    assert rates["zrangebyscore"] == 0, rates  # nothing scheduled: move_due stops at its ZCARD
