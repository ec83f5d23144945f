import importlib

import pytest

from tests import tasks_settings


@pytest.fixture(autouse=True)
def tasks_backend(settings):
    """This process enqueues to the StreamsBackend of tests.tasks_settings (Django resets its backends
    when TASKS changes)."""
    settings.TASKS = tasks_settings.TASKS
    yield


@pytest.fixture
def jobs(tasks_backend):
    """tests/testapp/tasks.py, imported once TASKS names the StreamsBackend (its Tasks are validated then)."""
    return importlib.import_module("tests.testapp.tasks")


@pytest.fixture
def run_workers(run_consumer):
    """``runconsumer`` (or ``command``) with tests.tasks_settings (``options``: the backend's OPTIONS)."""
    import json

    def start(*args, options=None, streams=None, env=None, command="runconsumer"):
        env = {"DJANGO_SETTINGS_MODULE": "tests.tasks_settings",
               "SHOAL_TEST_TASKS_OPTIONS": json.dumps(options or {}), **(env or {})}
        return run_consumer(*args, streams=streams, env=env, command=command)

    return start
