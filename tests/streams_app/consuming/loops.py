"""Building GroupLoops in the test process and driving them pass by pass."""
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from streams_app.conf import get_settings
from streams_app.redis.connection import dedicated_connection, get_connection
from streams_app.consuming.loop import GroupLoop
from streams_app.registry import select
from streams_app.consuming.worker import Shutdown


@pytest.fixture
def make_loop(redis):
    made = []

    def make(selector="jobs:a", name="me", threads=2, **overrides):
        [spec] = select([selector])
        config = {**get_settings(), "BLOCK_MS": 50, **overrides}
        executor = ThreadPoolExecutor(threads)
        loop = GroupLoop(spec, name, conn=get_connection(), reader=dedicated_connection(f"test-{name}"),
                         executor=executor, threads=threads, shutdown=Shutdown(), config=config)
        made.append(executor)
        return loop

    yield make
    for executor in made:
        executor.shutdown(wait=True)


def run_until(loops, condition, timeout=15):
    loops = loops if isinstance(loops, (list, tuple)) else [loops]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "loop did not get there in time"
        for loop in loops:
            loop.tick()


def settled(loop):
    return not loop.in_flight and not loop.to_ack and not loop.to_dead_letter and not loop.errors
