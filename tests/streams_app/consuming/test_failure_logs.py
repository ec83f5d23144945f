"""A burst of failing deliveries logs its first lines and a count, not one line per delivery."""
import re
import signal

from streams_app import publish_many
from tests.waiting import wait_for


def test_a_burst_of_failures_is_summarised_per_error_type(run_consumer, redis):
    publish_many("failing", [{"n": n} for n in range(100)])  # the handler always raises ValueError
    proc = run_consumer("failing:g", "--threads", "8")
    wait_for(lambda: redis.xlen("{failing}:dlq") == 100, timeout=120, what="every entry dead-lettered")
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.output()
    out = proc.output()
    logged = len(re.findall(r"handler failed on entry", out))
    held = sum(int(n) for n in re.findall(r"\.\.\. and (\d+) more handler failures \(ValueError\) on failing", out))
    assert logged + held == 400, out  # 100 entries, max_deliveries=4: every failure accounted for
    assert logged <= 20, f"{logged} lines for one kind of failure"
