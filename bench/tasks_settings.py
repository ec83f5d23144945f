"""bench/tasks.py's processes: the benchmark settings plus a StreamsBackend with its two queues."""
import json
import os

from bench.settings import *  # noqa: F401,F403

TASKS = {
    "default": {
        "BACKEND": "streams_app.tasks.StreamsBackend",
        # bench/tasks_idle.py adds its own queues. Every task module installed must find its queue here:
        # the benchmark app's (bnoop, bsleep) and the test app's (tests/testapp, installed for its models:
        # default, emails). The backport refuses a task of a queue its backend lacks as its module imports
        # (streams_app.E069 then stops every command).
        "QUEUES": [*json.loads(os.environ.get("BENCH_TASK_QUEUES", "[]")), "bnoop", "bsleep", "default", "emails"],
    },
}
