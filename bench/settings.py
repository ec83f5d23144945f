"""Settings for benchmark processes: the test settings plus the benchmark handlers."""
from tests.settings import *  # noqa: F401,F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]
