"""Where Django 5.2 and 6.1 differ under Shoal, each version must end up doing the same thing.

The matrix (noxfile.py) runs this module on both versions; what is version-specific says so.
"""
import django
import pytest
from django.contrib.admin.sites import site

from streams_app.models import DeadLetter
from tests.waiting import wait_for


def test_commands_start_while_the_database_is_unreachable(run_consumer, redis, tmp_path):
    # Django 6.1 hands the model checks every database, and a JSONField's check connects (on SQLite, to
    # learn whether JSON is supported): without shoal_common.cli.ShoalCommand a consumer, or a publish,
    # would not start while its database cannot be opened.
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'no-such-directory' / 'db.sqlite3'}"}
    publisher = run_consumer("jobs", '{"n": 1}', command="publish", env=env)
    assert publisher.wait(timeout=60) == 0, publisher.output()
    consumer = run_consumer("jobs:a", env=env)
    consumer.wait_for_output("started (jobs:a", timeout=60)
    wait_for(lambda: redis.llen("handled:jobs:a") == 1, timeout=30, what="the message handled")


@pytest.mark.django_db
def test_mirror_admins_offer_no_delete_selected_on_either_version(rf, admin_user):
    request = rf.get("/admin/streams_app/deadletter/")
    request.user = admin_user
    model_admin = site._registry[DeadLetter]
    assert "delete_selected" not in model_admin.get_actions(request)
    if django.VERSION >= (6, 1):
        from django.contrib.admin import ActionLocation

        assert "delete_selected" not in model_admin.get_actions(request, action_location=ActionLocation.CHANGE_FORM)


def test_the_web_boot_check_runs_the_system_checks_without_touching_a_database():
    # No django_db mark: pytest-django refuses any database access here. Django 6.1's model checks open a
    # connection unless told not to (the trial: a database that was unreachable aborted every HUP and kept
    # any worker from booting). streams_app/web/app_check.py passes databases=[].
    from streams_app.web.app_check import system_check_errors

    assert system_check_errors() == []
