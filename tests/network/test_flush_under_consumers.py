"""Redis flushed (as a restart without persistence leaves it) under running consumers while entries keep
coming: each consumer logs the loss in a few lines, not one per pass, and does not spin while the lost
group settles. Counted in the processes' own output and CPU time (/proc/<pid>/stat of the processes
this test started)."""
import json
import os
import threading
import time

import pytest

from tests.waiting import wait_for

pytestmark = pytest.mark.slow

WINDOW = 15  # seconds watched after the flush: longer than a lost group's settling time (10.5 s)
MAX_LINES = 50  # per process, for the whole window
MAX_CPU_SHARE = 0.3  # CPU seconds per wall second, per process


def _cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class Publisher(threading.Thread):
    def __init__(self, redis):
        super().__init__(daemon=True)
        self.redis = redis
        self.stop = threading.Event()

    def run(self):
        n = 0
        while not self.stop.wait(0.02):
            try:
                self.redis.xadd("jobs", {"payload": json.dumps({"n": n})})
                n += 1
            except Exception:  # noqa: BLE001  (the test's own publisher: keep going)
                pass


def test_a_flush_under_busy_consumers_costs_a_few_log_lines_and_no_busy_loop(redis, run_consumer):
    redis.xgroup_create("jobs", "a", id="$", mkstream=True)
    procs = [run_consumer("jobs:a") for _ in range(2)]
    for proc in procs:
        proc.wait_for_output("started")
    publisher = Publisher(redis)
    publisher.start()
    wait_for(lambda: redis.llen("handled:jobs:a") > 50, timeout=30, what="the consumers handling")
    try:
        marks = [len(proc.lines) for proc in procs]
        cpu = [_cpu_seconds(proc.pid) for proc in procs]
        started = time.monotonic()
        redis.flushall()
        # Handled again after the loss (the flush also dropped the handled list).
        wait_for(lambda: redis.llen("handled:jobs:a") > 50, timeout=WINDOW, what="handling again after the flush")
        time.sleep(max(0.0, WINDOW - (time.monotonic() - started)))  # the window is what is measured
        wall = time.monotonic() - started
        for proc, mark, before in zip(procs, marks, cpu):
            lines = proc.lines[mark:]
            used = _cpu_seconds(proc.pid) - before
            print(f"pid {proc.pid}: {len(lines)} lines, {used:.2f} CPU s in {wall:.1f} s")
            assert len(lines) < MAX_LINES, "".join(lines[:40])
            assert used < MAX_CPU_SHARE * wall, f"{used:.1f} CPU s in {wall:.1f} s"
    finally:
        publisher.stop.set()
        publisher.join()
