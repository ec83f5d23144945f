"""bench/tasks.py's processes: the benchmark settings plus a StreamsBackend with its two queues."""
import json
import os

from bench.settings import *  # noqa: F401,F403

TASKS = {
    "default": {
        "BACKEND": "streams_app.tasks.StreamsBackend",
        # bench/tasks_idle.py names its own queues.
        "QUEUES": json.loads(os.environ.get("BENCH_TASK_QUEUES", '["bnoop", "bsleep"]')),
    },
}
