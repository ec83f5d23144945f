"""Settings for bench/http_bench.py: Shoal's test settings with a URLconf that adds a trivial view."""
from tests.settings import *  # noqa: F401,F403

ROOT_URLCONF = "http_urls"
