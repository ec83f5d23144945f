"""bench/tasks.py's processes: the benchmark settings plus a StreamsBackend with its two queues."""
import json
import os

from bench.settings import *  # noqa: F401,F403

TASKS = {
    "default": {
        "BACKEND": "streams_app.tasks.StreamsBackend",
        # bench/tasks_idle.py names its own queues. The test app's tasks (tests/testapp, installed for its
        # models) name "default" and "emails": Django 6 refuses a task of a queue its backend lacks as
        # its module imports (streams_app.E069 then stops every command).
        "QUEUES": [*json.loads(os.environ.get("BENCH_TASK_QUEUES", '["bnoop", "bsleep"]')), "default", "emails"],
    },
}
