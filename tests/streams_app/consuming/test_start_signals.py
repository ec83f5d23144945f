"""A single-process ``runconsumer`` that waits for Redis at start stops on the first TERM/INT, exit 0."""
import signal
from types import SimpleNamespace

import pytest

from tests.redis_server import free_port


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_the_first_signal_stops_a_consumer_waiting_for_redis_at_start(run_consumer, sig):
    nobody = SimpleNamespace(url=f"redis://127.0.0.1:{free_port()}/0")  # connects are refused
    proc = run_consumer("jobs:a", server=nobody)
    proc.wait_for_output("Redis unreachable at start")
    proc.signal(sig)
    assert proc.wait(15) == 0, proc.output()
    assert f"{sig.name} received while waiting for Redis at start; stopped" in proc.output()
