"""A master killed with SIGKILL leaves its metrics directory; the next master removes it."""
import os
import signal

from tests.redis_server import free_port
from tests.waiting import wait_for


def test_the_next_master_removes_the_directory_of_a_killed_one(run_consumer, tmp_path):
    parent = tmp_path / "shoal-consumer-metrics"
    env = {"TMPDIR": str(tmp_path)}  # tempfile.gettempdir(), where the directories go
    first = run_consumer("jobs:a", "--workers", "1", "--metrics-port", str(free_port()), env=env)
    first.wait_for_output("is consuming", timeout=60)
    (left,) = list(parent.iterdir())
    first.kill()  # SIGKILL: no atexit, the directory stays
    assert left.exists()
    os.utime(left, (0, 0))  # as if it had been left long ago (younger ones are spared)
    second = run_consumer("jobs:a", "--workers", "1", "--metrics-port", str(free_port()), env=env)
    second.wait_for_output("is consuming", timeout=60)
    assert not left.exists(), "the killed master's directory is still there"
    assert len(list(parent.iterdir())) == 1  # the second master's own, which it keeps
    second.signal(signal.SIGTERM)
    assert second.wait(timeout=60) == 0, second.output()
    wait_for(lambda: not list(parent.iterdir()), timeout=10, what="a clean stop to remove its own directory")
