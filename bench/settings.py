"""Settings for benchmark processes: the test settings plus the benchmark handlers."""
import gc
import os

from tests.settings import *  # noqa: F401,F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]

# bench/throughput.py --gc-threshold: what the cyclic garbage collector costs per message (an experiment,
# not a recommendation; Shoal's own settings do not touch the collector).
if os.environ.get("BENCH_GC_THRESHOLD"):
    gc.set_threshold(int(os.environ["BENCH_GC_THRESHOLD"]))
