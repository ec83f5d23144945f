"""A real gunicorn master (started as the README says) in the discovery registry: registered while it
serves, deregistered as soon as it is told to stop (before its drain), its registration process
supervised, and never advertised at a loopback address when bound to every interface."""
import ipaddress
import json
import os
import signal
import socket
import time

import pytest

from discovery_app.registry import ServiceRegistry
from shoal_common.web_supervision import default_route_address
from tests.processes import children_running
from tests.redis_server import free_port
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.both_redis]


def accept_queue_length(port):
    """Connections the kernel holds for gunicorn's listening socket on `port` that no worker has
    accepted yet (the listening socket's rx_queue in /proc/net/tcp)."""
    with open("/proc/net/tcp") as table:
        for line in list(table)[1:]:
            fields = line.split()
            local, state, queues = fields[1], fields[3], fields[4]
            if state == "0A" and int(local.split(":")[1], 16) == port:  # 0A: LISTEN
                return int(queues.split(":")[1], 16)
    raise AssertionError(f"no socket listening on port {port}")


def registration_status(server):
    _, body = server.get("/readyz")
    return json.loads(body).get("discovery_registration")


def test_gunicorn_registers_the_web_instance_and_deregisters_on_stop(gunicorn, redis, settings):
    server = gunicorn(workers=1, env={"WEB_SERVICE_NAME": "shoal-web-test"})
    registry = ServiceRegistry()
    [instance] = wait_for(lambda: registry.instances("shoal-web-test"), timeout=30, what="the web instance registered")
    assert (instance.address, instance.port, instance.scheme) == ("127.0.0.1", server.port, "http")
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0
    wait_for(lambda: registry.instances("shoal-web-test") == [], timeout=30, what="the web instance deregistered")
    output = "".join(server.lines)
    assert "deregistered" in output and "Fatal Python error" not in output, output[-2000:]


def test_the_registration_process_stops_cleanly_on_sigterm_and_is_started_again(gunicorn, redis, settings):
    # `make run` (honcho) and Ctrl-C signal the whole process group, the registration process too.
    # The registration process is looked for only among this gunicorn's children: other checkouts on
    # this host run their own, and signalling one of theirs failed their tests.
    server = gunicorn(workers=1, env={"WEB_SERVICE_NAME": "shoal-web-test"})
    registry = ServiceRegistry()
    wait_for(lambda: registry.instances("shoal-web-test"), timeout=30, what="the web instance registered")
    [registration] = children_running(server.proc.pid, "discovery_app.web_registration")
    assert registration == registration_status(server)["pid"]

    os.kill(registration, signal.SIGTERM)
    wait_for(lambda: registry.instances("shoal-web-test") == [], timeout=30, what="deregistered on SIGTERM")
    # Supervised: the master starts it again, and the instance is back.
    wait_for(lambda: registration_status(server)["restarts"] == 1, timeout=30, what="the registration restarted")
    wait_for(lambda: registry.instances("shoal-web-test"), timeout=30, what="registered again")
    output = "".join(server.lines)
    assert "Fatal Python error" not in output, output[-2000:]


def test_sigterm_deregisters_before_the_drain(gunicorn, redis, settings):
    server = gunicorn(workers=1, env={"WEB_SERVICE_NAME": "shoal-web-test"}, args=["--graceful-timeout", "60"])
    registry = ServiceRegistry()
    wait_for(lambda: registry.instances("shoal-web-test"), timeout=30, what="the web instance registered")
    # A request in flight (its client is slow to send it): gunicorn drains, waiting for it.
    slow_client = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    slow_client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    # Only a connection a worker has accepted is drained: one still in the kernel's accept queue when
    # the listening socket closes is reset (CI's load once had TERM arrive before the accept).
    wait_for(lambda: accept_queue_length(server.port) == 0, timeout=30, what="the worker accepted the slow request")
    try:
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: registry.instances("shoal-web-test") == [], timeout=20,
                 what="deregistration while the drain is still waiting for the request in flight")
        assert server.proc.poll() is None  # still draining: nothing new should be sent its way
        slow_client.sendall(b"\r\n")
        assert b"200 OK" in slow_client.recv(4096)  # the drain still served it
    finally:
        slow_client.close()
    assert server.proc.wait(60) == 0
    assert "deregistering before the drain" in server.output() and "Fatal Python error" not in server.output()


def test_a_dead_registration_process_is_restarted_and_shown_in_readyz(gunicorn, redis, settings):
    server = gunicorn(workers=1, env={"WEB_SERVICE_NAME": "shoal-web-test"})
    registry = ServiceRegistry()
    [before] = wait_for(lambda: registry.instances("shoal-web-test"), timeout=30, what="the web instance registered")
    status = registration_status(server)
    assert status["state"] == "running" and status["restarts"] == 0
    os.kill(status["pid"], signal.SIGKILL)  # OOM killer, an operator's mistake
    status = wait_for(lambda: (s := registration_status(server))["restarts"] == 1 and s["state"] == "running" and s,
                      timeout=30, what="the registration process restarted")
    assert "Discovery registration process (pid" in server.output() and "[WARNING]" in server.output()
    # The new process registered the same instance again (one record, a new registration of it),
    # and keeps it alive: its heartbeats move on.
    [after] = wait_for(lambda: [i for i in registry.instances("shoal-web-test") if i.registration != before.registration],
                       timeout=30, what="the new process's registration")
    assert after.instance_id == before.instance_id and len(registry.instances("shoal-web-test")) == 1
    wait_for(lambda: registry.instances("shoal-web-test")[0].last_heartbeat > after.last_heartbeat, timeout=30,
             what="a heartbeat from the new process")


def test_bound_to_every_interface_it_advertises_a_routable_address(gunicorn, redis, settings):
    port = free_port()
    server = gunicorn(workers=1, env={"WEB_SERVICE_NAME": "shoal-web-test", "PORT": str(port)})
    registry = ServiceRegistry()
    expected = default_route_address()
    if expected is None or ipaddress.ip_address(expected).is_loopback:
        wait_for(lambda: "Discovery registration skipped" in server.output(), timeout=30, what="a refusal")
        assert registry.instances("shoal-web-test") == []
        return
    [instance] = wait_for(lambda: registry.instances("shoal-web-test"), timeout=30, what="the web instance registered")
    assert not ipaddress.ip_address(instance.address).is_loopback
    assert (instance.address, instance.port) == (expected, port)
    assert "advertised as the interface of the default route" in server.output()


def established_to(port):
    """Server-side connections to ``port`` that are open (ESTABLISHED in /proc/net/tcp), accepted or not."""
    with open("/proc/net/tcp") as table:
        return sum(1 for line in list(table)[1:]
                   if line.split()[3] == "01" and int(line.split()[1].split(":")[1], 16) == port)


# Deregistration on TERM takes milliseconds when nothing is in its way; a probe of /readyz stuck behind busy
# workers held it until the probe's timeout (PROBE_TIMEOUT, 3 s after the probe began; the TERM below comes
# within a poll of the probe's start). Far enough from both that neither a loaded machine nor the old code
# lands on the wrong side.
DEREGISTERED_WITHIN = 1.5


def test_sigterm_deregisters_at_once_while_a_readyz_probe_waits_behind_a_busy_worker(gunicorn, redis, settings):
    # Trial t34, finding 1: one worker with one thread, busy; the registration process's /readyz probe waits
    # in that worker's queue. TERM then deregistered only when the probe gave up, while the master already
    # refused connections and clients still resolved the instance.
    server = gunicorn(workers=1, env={"WEB_SERVICE_NAME": "shoal-web-test", "GUNICORN_THREADS": "1"},
                      args=["--graceful-timeout", "60"])
    registry = ServiceRegistry()
    wait_for(lambda: registry.instances("shoal-web-test"), timeout=30, what="the web instance registered")
    # The worker's only thread reads a request whose client never finishes it.
    busy = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    busy.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    try:
        wait_for(lambda: established_to(server.port) == 1, timeout=30, what="the busy connection alone")
        # The next heartbeat's probe (HEARTBEAT_INTERVAL, 10 s) connects and waits behind it.
        wait_for(lambda: established_to(server.port) >= 2, timeout=30, interval=0.005, what="a /readyz probe waiting")
        signalled_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: registry.instances("shoal-web-test") == [], timeout=30, interval=0.005,
                 what="the web instance deregistered")
        took = time.monotonic() - signalled_at
        assert took < DEREGISTERED_WITHIN, f"deregistered {took:.2f} s after TERM, behind the probe"
    finally:
        busy.close()
    assert server.proc.wait(60) == 0
    assert "Fatal Python error" not in server.output(), server.output()[-2000:]
