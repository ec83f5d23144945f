"""Registered instances in the admin: the mirror, and deregistering with permission, confirmation and audit."""
import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry

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


def test_drain_and_undrain_confirm_change_the_registry_and_are_audited(staff_client, registry):
    from discovery_app.client import DiscoveryClient

    drained = registry.register("orders", "10.0.0.1", 8000)
    other = registry.register("orders", "10.0.0.2", 8000)
    client = staff_client("discovery_app.drain_instance")
    client.get(CHANGELIST)
    pk = ServiceInstance.objects.get(instance_id=drained.instance_id).pk
    confirm = client.post(CHANGELIST, {"action": "drain", "_selected_action": [str(pk)], "index": "0"})
    assert b"Are you sure?" in confirm.content
    assert not any(i.draining for i in registry.instances("orders"))  # nothing done before the confirmation
    done = client.post(CHANGELIST, {"action": "drain", "_selected_action": [str(pk)], "post": "yes"}, follow=True)
    assert "1 instance is draining." in [str(m) for m in done.context["messages"]]
    assert {i.instance_id: i.draining for i in registry.instances("orders")} == {
        drained.instance_id: True, other.instance_id: False}
    # Clients stop picking it, and it stays registered.
    resolver = DiscoveryClient()
    assert {resolver.resolve("orders").instance_id for _ in range(20)} == {other.instance_id}
    assert "draining" in client.get(CHANGELIST).content.decode()
    log = LogEntry.objects.get()
    assert log.action_flag == CHANGE and drained.instance_id in log.change_message and "draining" in log.change_message

    client.post(CHANGELIST, {"action": "undrain", "_selected_action": [str(pk)], "post": "yes"})
    assert not any(i.draining for i in registry.instances("orders"))
    assert LogEntry.objects.count() == 2 and "back in rotation" in LogEntry.objects.latest("pk").change_message


def test_draining_needs_its_own_permission(staff_client, registry):
    registry.register("orders", "10.0.0.1", 8000)
    client = staff_client("discovery_app.deregister_instance")
    html = client.get(CHANGELIST).content.decode()
    assert 'value="drain"' not in html and 'value="deregister"' in html
    pk = ServiceInstance.objects.get().pk
    assert client.post(CHANGELIST, {"action": "drain", "_selected_action": [str(pk)], "post": "yes"}).status_code == 403
    assert not registry.instances("orders")[0].draining
