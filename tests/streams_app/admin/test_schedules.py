"""The control room's Schedules page: who sees it, each periodic task with its schedule in words, next and
last run (linked to the result on the Tasks page), "Run now" (permission, confirmation, POST+CSRF, LogEntry)
and Redis down."""
import importlib
import json

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.auth.models import User
from django.test import Client

from streams_app.tasks.periodic import entries, scheduler
from tests import tasks_settings
from tests.streams_app.admin.fixtures import staff_client  # noqa: F401

pytestmark = [pytest.mark.django_db]

SCHEDULES = "/admin/streams_app/periodicschedule/"
TASKS = "/admin/streams_app/taskresult/"
VIEW = "streams_app.view_periodicschedule"
RUN = "streams_app.run_periodicschedule"
PERIODIC = {
    "beat": {"task": "tests.testapp.tasks.add", "every": 5, "args": [1, 2]},
    "nightly": {"task": "tests.testapp.tasks.send_email", "cron": "*/5 * * * *", "timezone": "Europe/Paris",
                "args": ["ops@example.com"], "kwargs": {"subject": "report"}},
    "broken": {"task": "tests.testapp.tasks.add", "every": 0},  # refused by the checks (E064): not listed
}


@pytest.fixture
def jobs(settings):
    settings.TASKS = {"default": {**tasks_settings.TASKS["default"], "OPTIONS": {"PERIODIC": PERIODIC}}}
    return importlib.import_module("tests.testapp.tasks")


def beat():
    return next(entry for entry in entries.entries() if entry.name == "beat")


def test_staff_need_the_view_permission(client, staff_client, jobs, redis):
    assert "/login/" in client.get(SCHEDULES)["Location"]
    plain = staff_client()
    assert plain.get(SCHEDULES).status_code == 403
    assert f'href="{SCHEDULES}"' not in plain.get("/admin/").content.decode()
    assert plain.post(f"{SCHEDULES}default/beat/run/", {"action": "run", "post": "yes"}).status_code == 403
    assert redis.xlen("tasks:default") == 0


def test_the_page_lists_each_schedule_in_words_with_next_and_last_run_linked_to_its_result(staff_client, jobs, redis):
    tick = 1_700_000_000_000
    scheduler.enqueue_tick(redis, beat(), tick)
    client = staff_client(VIEW)
    assert f'href="{SCHEDULES}"' in client.get("/admin/").content.decode()
    page = client.get(SCHEDULES)
    assert page.status_code == 200
    html = page.content.decode()
    assert "every 5 seconds" in html and "cron */5 * * * * (Europe/Paris)" in html
    assert "tests.testapp.tasks.send_email" in html and "emails" in html
    assert f'href="{TASKS}{scheduler.result_id(beat(), tick)}/"' in html  # the last run's result
    assert "READY" in html
    rows = {row["entry"].name: row for row in page.context["rows"]}
    assert set(rows) == {"beat", "nightly"} and page.context["refused"] == 1
    assert "1 entry refused by the system checks" in html
    assert rows["beat"]["next"] is not None and rows["nightly"]["last"] is None
    assert "Run now" not in html  # without the permission, no button


def test_run_now_needs_its_permission_confirms_and_enqueues_one_run_with_an_audit_entry(staff_client, jobs, redis):
    run_url = f"{SCHEDULES}default/beat/run/"
    viewer = staff_client(VIEW)
    assert viewer.post(run_url, {"action": "run", "post": "yes"}).status_code == 403
    client = staff_client(VIEW, RUN)
    assert "Run now" in client.get(SCHEDULES).content.decode()
    assert client.get(run_url).status_code == 302  # a GET changes nothing
    confirm = client.post(run_url, {"action": "run"})
    assert confirm.status_code == 200 and "Are you sure?" in confirm.content.decode()
    assert "every 5 seconds" in confirm.content.decode() and redis.xlen("tasks:default") == 0
    done = client.post(run_url, {"action": "run", "post": "yes"}, follow=True)
    assert done.status_code == 200
    [(_, fields)] = redis.xrange("tasks:default")
    new_id = json.loads(fields["payload"])["id"]
    assert jobs.add.get_result(new_id).args == [1, 2]
    assert any(f"as result {new_id}" in str(m) for m in done.context["messages"])
    assert f'href="{TASKS}{new_id}/"' in done.content.decode()  # the last "Run now", linked
    [entry] = LogEntry.objects.filter(action_flag=ADDITION, object_id="default:beat")
    assert new_id in entry.change_message and entry.user.username == "staff1"


def test_run_now_needs_csrf_and_a_known_schedule(staff_client, jobs, redis):
    client = staff_client(VIEW, RUN)
    assert client.post(f"{SCHEDULES}default/nope/run/", {"action": "run", "post": "yes"}).status_code == 404
    assert client.post(f"{SCHEDULES}default/broken/run/", {"action": "run", "post": "yes"}).status_code == 404
    checked = Client(enforce_csrf_checks=True)
    checked.force_login(User.objects.get(username="staff0"))
    assert checked.post(f"{SCHEDULES}default/beat/run/", {"action": "run", "post": "yes"}).status_code == 403
    assert redis.xlen("tasks:default") == 0


def test_with_redis_down_the_page_says_so(staff_client, jobs, redis_factory, use_redis):
    server = redis_factory()
    use_redis(server)
    client = staff_client(VIEW, RUN)
    server.stop()
    page = client.get(SCHEDULES)
    assert page.status_code == 200 and "Redis is unreachable" in page.content.decode()
    assert "every 5 seconds" in page.content.decode()  # the schedules come from the settings
    run = client.post(f"{SCHEDULES}default/beat/run/", {"action": "run", "post": "yes"}, follow=True)
    assert run.status_code == 200
    assert any("may or may not have been enqueued" in str(m) for m in run.context["messages"])
