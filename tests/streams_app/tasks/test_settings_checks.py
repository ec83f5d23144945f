"""Bad TASKS settings as ``manage.py check`` reports them in a project whose urls import its tasks (the
trial's urls -> views -> tasks): the documented system checks E060-E063 with their hint, or one line
(exit 3), never "Configuration error in consumers.py" or a traceback."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BACKEND = {"BACKEND": "streams_app.tasks.StreamsBackend", "QUEUES": ["default", "emails"]}


@pytest.fixture
def check(tmp_path, redis_server):
    return lambda tasks, extra="": run_check(tmp_path, redis_server.url, tasks, extra)


def run_check(tmp_path, redis_url, tasks, extra):
    (tmp_path / "badsettings.py").write_text(textwrap.dedent(f"""\
        from tests.tasks_settings import *  # noqa
        TASKS = {tasks!r}
        ROOT_URLCONF = "badurls"
    """))
    (tmp_path / "badurls.py").write_text(f"import tests.testapp.tasks  # noqa\n{extra}urlpatterns = []\n")
    # Django 6.1's check opens the database (JSONField's check): one of the test's own.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "badsettings", "PYTHONPATH": f"{tmp_path}:{ROOT}",
           "DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3", "REDIS_URL": redis_url}
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "Traceback" not in out and "consumers.py" not in out, out
    return done.returncode, out


@pytest.mark.parametrize("tasks, expected", [
    ({"default": BACKEND, "other": {**BACKEND, "QUEUES": ["other", "emails"]}},
     ["streams_app.E063", "both name queue 'emails'", "Give each backend its own queue names."]),
    ({"default": {**BACKEND, "OPTIONS": {"MAX_DELIVERIES": 0}}},
     ["streams_app.E060", "MAX_DELIVERIES must be a positive whole number, not 0", "HINT"]),
    ({"default": {**BACKEND, "OPTIONS": {"IDEMPOTENT": "yes"}}},
     ["streams_app.E060", "IDEMPOTENT must be None, 'redis' or 'db', not 'yes'", "HINT"]),
    ({"default": {**BACKEND, "OPTIONS": {"OUTBOX": True, "DATABASE": "other"}}},
     ["streams_app.E060", "names no database: 'other' is not in DATABASES", "HINT"]),
])
def test_a_bad_tasks_setting_is_its_system_check(check, tasks, expected):
    returncode, out = check(tasks)
    assert returncode == 1, out
    for text in expected:
        assert text in out, out


def test_queues_given_as_a_string_is_one_line_naming_the_setting(check):
    returncode, out = check({"default": {**BACKEND, "QUEUES": "default"}})
    assert returncode == 3, out
    assert "TASKS['default']['QUEUES'] must be a non-empty list of queue names, not 'default'" in out, out
    assert "streams_app.E062" in out, out


def test_a_task_of_an_unknown_queue_is_one_line_naming_the_declaration(check, tmp_path):
    (tmp_path / "nopetasks.py").write_text(textwrap.dedent("""\
        from streams_app.tasks.api import Task  # noqa: F401
        try:
            from django.tasks import task
        except ImportError:
            from django_tasks import task


        @task(queue_name="nope")
        def lost():
            pass
    """))
    returncode, out = check({"default": BACKEND}, extra="import nopetasks  # noqa\n")
    assert returncode == 3, out
    assert f"the @task at {tmp_path / 'nopetasks.py'}:" in out and "Queue 'nope' is not valid" in out, out
