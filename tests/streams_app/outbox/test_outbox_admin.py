"""The outbox in the control room: the backlog on the index, the rows that keep failing and why."""
from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.utils import timezone

from streams_app import publish
from streams_app.outbox.models import OutboxMessage
from tests.streams_app.admin.fixtures import staff_client  # noqa: F401

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/streams_app/outboxmessage/"


def refused(key):
    publish("orders", {"n": 1}, key=key, outbox=True)
    OutboxMessage.objects.filter(key=key).update(
        attempts=3, last_error="Redis key 'orders' holds another type, not a stream (WRONGTYPE ...)",
        next_attempt_at=timezone.now() + timedelta(seconds=4))


def test_the_index_shows_the_outbox_backlog_and_links_to_the_failing_rows(staff_client, redis):
    client = staff_client("streams_app.view_outboxmessage")
    html = client.get("/admin/").content.decode()
    assert "Outbox</th><td>\nnothing waiting" in html
    publish("orders", {"n": 0}, key="fine", outbox=True)
    html = client.get("/admin/").content.decode()
    assert "1 row waiting</a>" in html
    assert "Outbox: 1 row waiting, the oldest" in client.get(CHANGELIST).content.decode()
    refused("bad")
    OutboxMessage.objects.update(created_at=timezone.now() - timedelta(seconds=120))
    html = client.get("/admin/").content.decode()
    summary = html[html.index('id="shoal-summary"'):]
    assert "2 rows waiting</a>, the oldest 12" in summary
    assert f'{CHANGELIST}?state=failing">1 refused by Redis</a>' in summary


def test_the_changelist_says_why_rows_fail_and_retry_needs_its_permission(staff_client, redis):
    refused("bad")
    publish("orders", {"n": 0}, key="fine", outbox=True)
    client = staff_client("streams_app.view_outboxmessage")
    page = client.get(CHANGELIST + "?state=failing").content.decode()
    assert "2 rows waiting" in page and "1 refused by Redis at least once" in page
    assert "holds another type, not a stream" in page and ">bad<" in page and ">fine<" not in page
    assert "retry_now" not in page  # no permission, no action
    assert client.get(CHANGELIST + "add/").status_code == 403

    client = staff_client("streams_app.view_outboxmessage", "streams_app.retry_outboxmessage")
    row = OutboxMessage.objects.get(key="bad")
    # A confirmation first (nothing changed yet), then the change, with an audit entry.
    confirm = client.post(CHANGELIST, {"action": "retry_now", "_selected_action": [str(row.pk)], "index": "0"})
    assert b"Are you sure?" in confirm.content and b"holds another type" in confirm.content
    row.refresh_from_db()
    assert row.next_attempt_at is not None and not LogEntry.objects.exists()
    response = client.post(CHANGELIST, {"action": "retry_now", "_selected_action": [str(row.pk)], "post": "yes"},
                           follow=True)
    assert "1 waiting row is due at the relay&#x27;s next pass." in response.content.decode()
    row.refresh_from_db()
    assert row.next_attempt_at is None and row.attempts == 3  # due now; its history stays
    log = LogEntry.objects.get()
    assert log.action_flag == CHANGE and log.object_id == str(row.pk) and "3 attempts" in log.change_message


@pytest.mark.parametrize("action", ["retry_now", "delete_selected"])
@pytest.mark.parametrize("step", [{"index": "0"}, {"post": "yes"}, {"index": "0", "post": "yes"}])
def test_view_only_staff_posting_an_outbox_action_get_403_and_nothing_changes(staff_client, redis, action, step):
    # Issue 33, item 9: they got 200, nothing done and nothing said, where every other action answers 403.
    refused("bad")
    row = OutboxMessage.objects.get(key="bad")
    client = staff_client("streams_app.view_outboxmessage")
    response = client.post(CHANGELIST, {"action": action, "_selected_action": [str(row.pk)], **step})
    assert response.status_code == 403
    row.refresh_from_db()
    assert row.next_attempt_at is not None and not LogEntry.objects.exists()
    # With the permission the same post goes on to the confirmation or the change.
    perm = {"retry_now": "streams_app.retry_outboxmessage", "delete_selected": "streams_app.delete_outboxmessage"}[action]
    allowed = staff_client("streams_app.view_outboxmessage", perm)
    assert allowed.post(CHANGELIST, {"action": action, "_selected_action": [str(row.pk)], **step}).status_code in (200, 302)
