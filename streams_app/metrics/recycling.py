"""``shoal_web_recycling_held``: whether the gunicorn master holds worker recycling, read at scrape time.

The master holds recycling from a worker's failed boot (an aborted rollout) until a worker loads the
app again (shoal_common/web_recycling.py). Read from the master's state file by whichever worker takes
the scrape, so the figure is the master's, not one worker's; absent outside Shoal's gunicorn config.
"""
import time

from prometheus_client.core import GaugeMetricFamily

from shoal_common import web_recycling


class RecyclingCollector:
    def __init__(self, read=web_recycling.read_state, clock=time.time):
        self.read = read
        self.clock = clock

    def collect(self):
        state = self.read()
        if not state:
            return
        held = state.get("recycling") == "held"
        yield GaugeMetricFamily("shoal_web_recycling_held",
                                "1 while the gunicorn master holds worker recycling because a worker could not load "
                                "the application (an aborted rollout): workers past max_requests keep serving.",
                                value=1.0 if held else 0.0)
        since = state.get("since")
        yield GaugeMetricFamily("shoal_web_recycling_held_seconds", "Seconds recycling has been held (0 when not).",
                                value=max(0.0, self.clock() - since) if held and since else 0.0)
