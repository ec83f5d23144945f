"""Staff users with chosen permissions, and real dead letters / pending entries to act on."""
import pytest
from django.contrib.auth.models import Permission, User

from streams_app import publish_many

from streams_app.deadletters import store as deadletters
from streams_app.consuming.groups import ensure_group

VIEW_PERMS = ["streams_app.view_stream", "streams_app.view_consumergroup", "streams_app.view_deadletter",
              "discovery_app.view_serviceinstance"]


@pytest.fixture
def staff_client(client, db):
    """``staff_client(*perms)``: the test client logged in as staff with the view permissions plus ``perms``."""
    made = []

    def login(*perms):
        user = User.objects.create_user(f"staff{len(made)}", password="x", is_staff=True)
        for perm in (*VIEW_PERMS, *perms):
            app_label, codename = perm.split(".")
            user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        made.append(user)
        client.force_login(user)
        return client

    return login


def pending(redis, stream, group, payloads, consumer="c1"):
    """Publish ``payloads`` and read them as ``consumer``: they are pending in ``group``.

    A new group starts at the stream's end, so it reads exactly these entries."""
    ensure_group(redis, stream, group, start="$")
    ids = publish_many(stream, payloads) if payloads else []
    redis.xreadgroup(group, consumer, {stream: ">"}, count=len(ids))
    return ids


def dead_letter(redis, payloads, stream="jobs", group="a", error="RuntimeError: asked to fail: bad input"):
    """Entries failed by ``group`` and moved to the dead-letter stream by the library; returns their DLQ ids."""
    ids = pending(redis, stream, group, payloads)
    result = deadletters.move(redis, stream, group, [(i, error, "Traceback (most recent call last):\n  ...\n" + error)
                                                     for i in ids])
    assert [i for i, _ in result.moved] == ids
    return result.dead_letter_ids
