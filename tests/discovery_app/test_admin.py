"""Registered instances in the admin: the mirror, and deregistering with permission, confirmation and audit."""
import pytest
from django.contrib.admin.models import DELETION, LogEntry

from discovery_app.models import ServiceInstance
from discovery_app.registry import ServiceRegistry
from discovery_app.sync import sync_instances
from tests.streams_app.admin.fixtures import staff_client  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.both_redis]

CHANGELIST = "/admin/discovery_app/serviceinstance/"


@pytest.fixture
def registry(redis):
    return ServiceRegistry()


def test_the_mirror_follows_the_registry(registry):
    one = registry.register("orders", "10.0.0.1", 8000, {"version": "1.2", "zone": "eu-1", "weight": 2})
    registry.register("billing", "10.0.0.2", 9000)
    assert sync_instances() == 2
    row = ServiceInstance.objects.get(instance_id=one.instance_id)
    assert (row.service, row.endpoint, row.version, row.zone, row.weight, row.healthy) == (
        "orders", "10.0.0.1:8000", "1.2", "eu-1", 2.0, True)
    assert row.last_heartbeat is not None
    registry.deregister(one)
    sync_instances()
    assert list(ServiceInstance.objects.values_list("service", flat=True)) == ["billing"]


def test_the_page_lists_instances_read_only_for_staff_without_the_permission(staff_client, registry):
    instance = registry.register("orders", "10.0.0.1", 8000, {"version": "1.2"})
    client = staff_client()
    html = client.get(CHANGELIST).content.decode()
    assert instance.instance_id in html and "10.0.0.1:8000" in html and "Copied from Redis" in html
    assert 'value="deregister"' not in html
    pk = ServiceInstance.objects.get().pk
    data = {"action": "deregister", "_selected_action": [str(pk)], "post": "yes"}
    assert client.post(CHANGELIST, data).status_code == 403
    assert [i.instance_id for i in registry.instances("orders")] == [instance.instance_id]


def test_deregister_confirms_then_removes_from_redis_with_an_audit_entry(staff_client, registry):
    instance = registry.register("orders", "10.0.0.1", 8000)
    client = staff_client("discovery_app.deregister_instance")
    client.get(CHANGELIST)
    pk = ServiceInstance.objects.get().pk
    confirm = client.post(CHANGELIST, {"action": "deregister", "_selected_action": [str(pk)], "index": "0"})
    assert b"Are you sure?" in confirm.content and registry.instances("orders")
    done = client.post(CHANGELIST, {"action": "deregister", "_selected_action": [str(pk)], "post": "yes"}, follow=True)
    assert "Deregistered 1 instance." in [str(m) for m in done.context["messages"]]
    assert registry.instances("orders") == []
    log = LogEntry.objects.get()
    assert log.action_flag == DELETION and instance.instance_id in log.change_message
    # Its next heartbeat does not bring it back.
    assert registry.heartbeat(instance.instance_id) == "deregistered"


def test_an_instance_gone_meanwhile_gets_a_message(staff_client, registry):
    instance = registry.register("orders", "10.0.0.1", 8000)
    client = staff_client("discovery_app.deregister_instance")
    client.get(CHANGELIST)
    pk = ServiceInstance.objects.get().pk
    registry.deregister(instance)
    done = client.post(CHANGELIST, {"action": "deregister", "_selected_action": [str(pk)], "post": "yes"}, follow=True)
    assert any("no longer registered" in str(m) for m in done.context["messages"])
    assert not LogEntry.objects.exists()
