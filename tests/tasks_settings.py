"""tests.settings with Django's Tasks on Shoal (tests/streams_app/tasks): two queues of a StreamsBackend.

Consumer subprocesses get OPTIONS overrides through SHOAL_TEST_TASKS_OPTIONS (JSON)."""
import json
import os

from tests.settings import *  # noqa: F401,F403

TASKS = {
    "default": {
        "BACKEND": "streams_app.tasks.StreamsBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": json.loads(os.environ.get("SHOAL_TEST_TASKS_OPTIONS", "{}")),
    },
}
