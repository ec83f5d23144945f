"""bench/tasks.py's processes: the benchmark settings plus a StreamsBackend with its two queues."""
from bench.settings import *  # noqa: F401,F403

TASKS = {
    "default": {
        "BACKEND": "streams_app.tasks.StreamsBackend",
        "QUEUES": ["bnoop", "bsleep"],
    },
}
