import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from discovery_app import keys
from discovery_app.registrar import Registrar
from discovery_app.registry import ServiceRegistry
from tests.conftest import ConsumerProcess
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis


@pytest.fixture
def registrars():
    started = []

    def make(*args, **kwargs):
        registrar = Registrar(*args, **kwargs)
        started.append(registrar)
        return registrar

    yield make
    for registrar in started:
        registrar.stop()


def ids(service):
    return [i.instance_id for i in ServiceRegistry().instances(service)]


def test_heartbeats_keep_a_live_instance_past_several_ttls(redis, registrars):
    pubsub = redis.pubsub()
    pubsub.subscribe(keys.events_channel())
    registrar = registrars("orders", "h", 1, {"zone": "a"}, interval=0.1, ttl=1.5).start()
    assert registrar.registered.is_set()
    absent = []
    until = time.monotonic() + 4  # well over two TTLs

    def watched_long_enough():
        if ids("orders") != [registrar.instance_id]:
            absent.append(time.monotonic())
        return time.monotonic() > until

    wait_for(watched_long_enough, timeout=15, interval=0.05, what="4 s of heartbeats")
    assert absent == []
    [found] = ServiceRegistry().instances("orders")
    assert found.last_heartbeat - found.registered_at > 3
    events = []
    while (message := pubsub.get_message(timeout=0.2)) is not None:
        if message["type"] == "message":
            events.append(json.loads(message["data"])["event"])
    assert events == ["registered"]  # never expired, never re-registered
    pubsub.close()


def test_stop_deregisters(redis, registrars):
    registrar = registrars("orders", "h", 1, interval=0.1).start()
    assert ids("orders") == [registrar.instance_id]
    registrar.stop()
    assert ids("orders") == []


def test_survives_a_redis_outage_and_registers_again(redis_factory, use_redis, registrars):
    server = redis_factory()
    use_redis(server)
    registrar = registrars("orders", "h", 1, interval=0.1, ttl=2).start()
    assert ids("orders") == [registrar.instance_id]
    server.stop()
    server.start()  # empty: the record is gone
    wait_for(lambda: ids("orders") == [registrar.instance_id], timeout=15, what="re-registration after the outage")


def test_registers_again_as_soon_as_redis_answers_not_at_the_end_of_a_long_back_off(
        redis_factory, use_redis, registrars, settings, caplog):
    # Issue 34 (round 3): after a long outage the registrar slept out its back-off (up to
    # HEARTBEAT_INTERVAL) before re-registering, although Redis answered again long before.
    settings.DISCOVERY = {"RETRY_BACKOFF_MAX": 30.0}
    server = redis_factory()
    use_redis(server)
    registrar = registrars("orders", "h", 1, interval=25, ttl=60).start()
    assert ids("orders") == [registrar.instance_id]
    server.stop()
    registrar._wake()  # the next heartbeat now, not in 25 s

    def backing_off():
        waits = [float(r.getMessage().rsplit("retrying in ", 1)[1].split()[0]) for r in caplog.records
                 if "retrying in" in r.getMessage()]
        return waits and waits[-1] >= 12

    wait_for(backing_off, timeout=60, what="a back-off of 12 s or more")
    server.start()  # empty: the record is gone
    # Well within the back-off left (12 s or more; a loaded machine gets 8 s): the registrar noticed Redis
    # answering again.
    wait_for(lambda: ids("orders") == [registrar.instance_id], timeout=8, interval=0.1,
             what="re-registration soon after Redis answers again")


def test_starting_while_redis_is_down_registers_once_it_is_up(redis_factory, use_redis, registrars):
    server = redis_factory()
    use_redis(server)
    server.stop()
    registrar = registrars("orders", "h", 1, interval=0.1).start(wait=2)
    assert not registrar.registered.is_set()
    server.start()
    wait_for(lambda: ids("orders") == [registrar.instance_id], timeout=15, what="registration once Redis is up")


def test_a_forked_child_does_not_deregister_its_parents_instance(redis, registrars):
    registrar = registrars("orders", "h", 1, interval=0.1).start()
    pid = os.fork()
    if pid == 0:  # the child, e.g. a gunicorn worker forked by a master that runs the Registrar
        try:
            registrar.stop()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert ids("orders") == [registrar.instance_id]


def test_operator_deregistration_sticks(redis, registrars):
    registrar = registrars("orders", "h", 1, interval=0.1).start()
    [instance] = ServiceRegistry().instances("orders")
    ServiceRegistry().deregister(instance)
    wait_for(lambda: registrar.deregistered_by_operator, timeout=10, what="the registrar to notice")
    assert ids("orders") == []


def test_register_command_heartbeats_until_sigterm_then_deregisters(redis_server, redis):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url,
           "PYTHONUNBUFFERED": "1"}
    proc = ConsumerProcess(["orders", "--address", "10.1.2.3", "--port", "8080", "--zone", "z1", "--weight", "2",
                            "--version", "1.4", "--tag", "blue", "--interval", "0.2"], env, command="register")
    try:
        proc.wait_for_output("Registered")
        [found] = ServiceRegistry().instances("orders")
        assert (found.url, found.zone, found.weight, found.version, found.tags) == \
            ("http://10.1.2.3:8080", "z1", 2.0, "1.4", ("blue",))
        first = found.last_heartbeat
        wait_for(lambda: ServiceRegistry().instances("orders")[0].last_heartbeat > first, what="a heartbeat")
        proc.signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "Deregistered" in proc.output()
        assert ServiceRegistry().instances("orders") == []
    finally:
        if proc.proc.poll() is None:
            proc.kill()


def test_register_command_rejects_bad_input_without_a_traceback(redis_server):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url}
    proc = ConsumerProcess(["a{b}", "--address", "h", "--port", "80"], env, command="register")
    assert proc.wait(timeout=30) == 3  # EXIT_CONFIG: a sidecar's service manager must not restart it
    assert "CommandError: service name 'a{b}' may not contain braces" in proc.output()
    assert "Traceback" not in proc.output()


def test_interpreter_exit_deregisters(redis_server, redis):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url}
    code = ("from discovery_app.registrar import Registrar; "
            "r = Registrar('orders', 'h', 1, interval=0.1).start(); "
            "assert r.registered.is_set(); print('up', r.instance_id)")
    proc = ConsumerProcess(["-c", code], env, command="shell")
    assert proc.wait(timeout=60) == 0, proc.output()
    assert "up orders-" in proc.output()
    assert ServiceRegistry().instances("orders") == []
    assert redis.zcard("discovery:{orders}:tombstones") == 1  # it was there, and was deregistered


def test_a_redis_error_that_is_not_a_disconnect_does_not_kill_the_heartbeats(redis, registrars):
    # OOM (or READONLY in a failover) is a ResponseError, not a ConnectionError.
    registrar = registrars("orders", "h", 1, interval=0.1, ttl=1).start()
    assert ids("orders") == [registrar.instance_id]
    redis.config_set("maxmemory", 1)
    try:
        redis.flushall()  # the record is gone and writes fail with OOM
        time.sleep(0.5)  # several heartbeats fail now: the outage under test
    finally:
        redis.config_set("maxmemory", 0)
    assert registrar._thread.is_alive(), "the heartbeat thread died on the OOM error"
    redis.delete(*redis.keys("*"))  # the instance must come back by itself: only a live thread can do that
    wait_for(lambda: ids("orders") == [registrar.instance_id], timeout=15, what="registered again after the OOM")


def test_start_after_stop_registers_again_and_forgets_the_operators_deregistration(redis, registrars):
    registrar = registrars("orders", "h", 1, interval=0.1).start()
    ServiceRegistry().deregister(registrar.instance_id, service="orders")
    wait_for(lambda: registrar.deregistered_by_operator, timeout=10, what="the registrar to notice")
    registrar.stop()
    registrar.start()
    assert registrar.registered.is_set()
    assert not registrar.deregistered_by_operator
    assert ids("orders") == [registrar.instance_id]
    registrar.stop()
    registrar.start()
    assert registrar.registered.is_set() and ids("orders") == [registrar.instance_id]


def test_an_old_process_stopping_does_not_deregister_the_new_one_with_the_same_id(redis, registrars):
    old = registrars("orders", "old-host", 1, interval=0.1, instance_id="orders-1").start()
    new = registrars("orders", "new-host", 1, interval=0.1, instance_id="orders-1").start()
    [instance] = ServiceRegistry().instances("orders")
    assert instance.address == "new-host"
    old.stop()
    [instance] = ServiceRegistry().instances("orders")
    assert instance.address == "new-host"
    # The new one keeps heartbeating: its heartbeats advance and nothing told it to stop.
    first = instance.last_heartbeat
    wait_for(lambda: ServiceRegistry().instances("orders")[0].last_heartbeat > first + 0.3, timeout=10,
             what="the new registration's heartbeats")
    assert not new.deregistered_by_operator and new.registered.is_set()
    new.stop()
    assert ids("orders") == []


def ports(service):
    return [i.port for i in ServiceRegistry().instances(service)]


def test_two_live_processes_with_one_instance_id_are_reported_and_the_survivor_takes_over(redis_server, redis):
    # A user trial: two sidecars given the same --instance-id; after one was SIGKILLed the survivor's
    # heartbeats kept the dead one's record (its port) alive for good, with no warning anywhere.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url,
           "PYTHONUNBUFFERED": "1"}
    common = ["--address", "127.0.0.1", "--instance-id", "orders-dup", "--interval", "0.3", "--ttl", "1.5"]
    first = ConsumerProcess(["orders", "--port", "1001", *common], env, command="register")
    second = None
    try:
        first.wait_for_output("Registered")
        assert ports("orders") == [1001]
        second = ConsumerProcess(["orders", "--port", "1002", *common], env, command="register")
        second.wait_for_output("Registered")
        assert ports("orders") == [1002]
        # Detected and reported by the process whose registration was replaced, at its next heartbeat.
        first.wait_for_output("is registered by another process (http://127.0.0.1:1002")
        # While both live, the first leaves the second's record alone: one record, the second's.
        time.sleep(1.0)
        assert ports("orders") == [1002]
        second.kill()
        second.wait(timeout=30)
        # The dead one's record expires (nobody refreshes it) and the survivor registers itself again.
        wait_for(lambda: ports("orders") == [1001], timeout=15, what="the survivor listed in place of the dead one")
        first.wait_for_output("registered again")
    finally:
        for proc in (first, second):
            if proc is not None and proc.proc.poll() is None:
                proc.kill()


REGISTRAR_SCRIPT = """
import os, signal, sys, time
import django
django.setup()
from discovery_app.registrar import Registrar
mode = sys.argv[1]
if mode == "handler":
    def drain(signum, frame):
        # os.write, not print: TERM can arrive while the main thread is still inside print("started"),
        # and a print from the handler then re-enters stdout's buffer (RuntimeError: reentrant call).
        os.write(1, b"app handler ran\\n")
    signal.signal(signal.SIGTERM, drain)
registrar = Registrar("orders", "10.0.0.1", 80, interval=0.2).start()
print("started", registrar.instance_id, flush=True)
if mode == "handler":
    time.sleep(60)  # the application's own drain, still serving
    print("drained", flush=True)
else:
    time.sleep(60)
"""


@pytest.mark.parametrize("mode", ["default", "handler"])
def test_sigterm_deregisters_at_once_and_keeps_the_applications_own_handling(redis_server, redis, mode):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url,
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", REGISTRAR_SCRIPT, mode], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        wait_for(lambda: any(line.startswith("started") for line in lines), timeout=30, what="the registrar started")
        assert len(ServiceRegistry().instances("orders")) == 1
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: ServiceRegistry().instances("orders") == [], timeout=15, what="deregistration on SIGTERM")
        if mode == "default":
            assert proc.wait(15) == -signal.SIGTERM  # then the default action: the process dies of it
        else:
            deadline = time.monotonic() + 30
            while "app handler ran\n" not in lines and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "app handler ran\n" in lines, ("".join(lines), proc.poll())
            assert proc.poll() is None  # chained: the application decides when to exit
            assert "drained\n" not in lines
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("args, message", [
    (["--weight", "nan"], "weight"),
    (["--weight", "inf"], "weight"),
    (["--interval", "30", "--ttl", "30"], "interval"),
    (["--ttl", "inf"], "--ttl"),
    (["--address", "not a host!"], "address"),
])
def test_register_command_refuses_values_that_would_fail_later(redis_server, args, message):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url}
    base = {"--address": "10.0.0.1", "--port": "80"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = ["orders", *[part for pair in base.items() for part in pair]]
    proc = ConsumerProcess(argv, env, command="register")
    assert proc.wait(timeout=30) != 0
    output = proc.output()
    assert ("CommandError" in output or "error: argument" in output) and message in output, output
    assert "Traceback" not in output, output
    assert ServiceRegistry().instances("orders") == []


def test_an_active_health_check_takes_a_failing_instance_out_and_brings_it_back(redis, registrars, http_service):
    from discovery_app.client import DiscoveryClient

    healthy = {"ok": True}
    sick = registrars("orders", "10.0.0.1", 80, interval=0.1, health_check=lambda: healthy["ok"],
                      health_failures=2).start(signals=())
    ServiceRegistry().register("orders", "10.0.0.2", 80)
    client = DiscoveryClient(cache_ttl=3600)
    try:
        assert client.wait_listening(10)
        assert {client.resolve("orders").address for _ in range(40)} == {"10.0.0.1", "10.0.0.2"}
        healthy["ok"] = False
        wait_for(lambda: {client.resolve("orders").address for _ in range(40)} == {"10.0.0.2"}, timeout=10,
                 what="clients to skip the instance whose check fails")
        [marked] = [i for i in ServiceRegistry().instances("orders") if i.address == "10.0.0.1"]
        assert marked.failing and sick.registered.is_set()  # still registered, heartbeating
        healthy["ok"] = True
        wait_for(lambda: {client.resolve("orders").address for _ in range(40)} == {"10.0.0.1", "10.0.0.2"}, timeout=10,
                 what="the instance back once its check passes")
    finally:
        client.close()


def test_a_health_check_url_is_probed_with_get(redis, registrars, http_service):
    service = http_service("readyz", status=503)
    registrar = registrars("orders", "10.0.0.1", 80, interval=0.1,
                           health_check=f"http://127.0.0.1:{service.port}/readyz", health_failures=1).start(signals=())
    wait_for(lambda: ServiceRegistry().instances("orders") and ServiceRegistry().instances("orders")[0].failing,
             timeout=10, what="the failing URL check to mark the instance")
    assert ("GET", "/readyz") in service.hits
    service.status = 200
    wait_for(lambda: not ServiceRegistry().instances("orders")[0].failing, timeout=10, what="recovery")
    assert registrar.registered.is_set()


FORKING_SCRIPT = """
import multiprocessing, time
import django
django.setup()
from discovery_app.registrar import Registrar
registrar = Registrar("orders", "10.0.0.1", 80, interval=0.2).start()
context = multiprocessing.get_context("fork")
running = context.Event()

def work():
    running.set()
    time.sleep(30)

child = context.Process(target=work)
child.start()
running.wait(30)  # a pool worker at work (a signal in the instant after fork() is CPython's to lose)
child.terminate()
started = time.monotonic()
child.join(60)
print("child", child.exitcode, round(time.monotonic() - started, 1), flush=True)
print("still registered", registrar.registered.is_set(), flush=True)
registrar.stop()
"""


def test_a_forked_child_of_a_registering_process_still_dies_of_sigterm(redis_server, redis):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url}
    done = subprocess.run([sys.executable, "-c", FORKING_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert f"child {-signal.SIGTERM} " in done.stdout, done.stdout + done.stderr  # not 0 after sleeping on
    assert "still registered True" in done.stdout, done.stdout + done.stderr  # the parent's record is untouched
