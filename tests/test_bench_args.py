"""The benchmarks refuse counts they cannot measure with argparse's one-line error, not a traceback
after minutes of publishing (a ZeroDivisionError for --messages 0 before)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("script", "args", "says"), [
    ("throughput.py", ["--messages", "0"], "argument --messages: 0 is too small: give 10000 or more"),
    ("throughput.py", ["--messages", "50"], "argument --messages: 50 is too small: give 10000 or more"),
    ("throughput.py", ["--repeat", "0"], "argument --repeat: 0 is too small: give 1 or more"),
    ("throughput.py", ["--workers", "-1"], "argument --workers: -1 is too small: give 1 or more"),
    ("publish.py", ["--batches", "100", "0"], "argument --batches: 0 is too small: give 1 or more"),
    ("publish.py", ["--single", "many"], "argument --single: 'many' is not a whole number"),
    ("tracing.py", ["--messages", "50"], "argument --messages: 50 is too small: give 10000 or more"),
    ("tracing.py", ["--repeat", "0"], "argument --repeat: 0 is too small: give 1 or more"),
    ("tasks_idle.py", ["--queues", "0"], "argument --queues: 0 is too small: give 1 or more"),
    ("tasks_scale.py", ["--workers", "0"], "argument --workers: 0 is too small: give 1 or more"),
])
def test_a_count_a_benchmark_cannot_use_is_refused_in_one_line(script, args, says):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr
