"""A DiscoveryClient's own life in a real service: dropped, closed, forked, used from asyncio."""
import asyncio
import gc
import logging
import os
import signal
import threading
import time

import pytest

from discovery_app import client as client_module
from discovery_app.client import DiscoveryClient
from discovery_app.exceptions import ClientClosed
from tests.waiting import wait_for


def listener_threads():
    return [t for t in threading.enumerate() if t.name.startswith("discovery-listener")]


def test_dropped_clients_leave_no_listener_thread_nor_redis_connection(registry, redis):
    registry.register("web", "127.0.0.1", 1)
    threads_before = len(listener_threads())
    connections_before = redis.info("clients")["connected_clients"]
    for _ in range(20):
        client = DiscoveryClient()  # one per request: the pattern that used to leak
        client.resolve("web")
        assert client.wait_listening(10)
        del client
    gc.collect()
    # At most the one shared listener of this process stays, and only while a client lives.
    wait_for(lambda: len(listener_threads()) <= threads_before + 1, timeout=20,
             what=f"listener threads back near {threads_before} (now {len(listener_threads())})")
    wait_for(lambda: redis.info("clients")["connected_clients"] <= connections_before + 1, timeout=20,
             what="Redis connections back to where they were")


def test_clients_share_one_listener_and_each_still_gets_change_events(registry):
    first = registry.register("web", "127.0.0.1", 1)
    clients = [DiscoveryClient(cache_ttl=3600) for _ in range(5)]
    try:
        for client in clients:
            assert client.resolve("web") == first
            assert client.wait_listening(10)
        assert len({id(client._hub) for client in clients}) == 1
        registry.deregister(first)
        second = registry.register("web", "127.0.0.1", 2)
        for client in clients:
            wait_for(lambda c=client: c.resolve("web") == second, timeout=10, what="the change event")
    finally:
        for client in clients:
            client.close()


def test_resolve_after_close_raises_instead_of_restarting_the_listener(registry):
    registry.register("web", "127.0.0.1", 1)
    client = DiscoveryClient()
    client.resolve("web")
    client.close()
    with pytest.raises(ClientClosed):
        client.resolve("web")
    with pytest.raises(ClientClosed):
        client.request("web", "GET", "/")
    assert client._hub is None


def test_a_client_is_a_context_manager(registry):
    registry.register("web", "127.0.0.1", 1)
    with DiscoveryClient() as client:
        assert client.resolve("web").port == 1
    with pytest.raises(ClientClosed):
        client.resolve("web")


def test_creating_many_clients_warns_once(registry, caplog, monkeypatch):
    monkeypatch.setattr(client_module, "_created", 0)
    kept = []
    with caplog.at_level(logging.WARNING, logger="discovery_app.client"):
        for _ in range(client_module.MANY_CLIENTS + 5):
            kept.append(DiscoveryClient(listen=False))
    warnings = [r for r in caplog.records if "DiscoveryClient objects" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "share one" in warnings[0].getMessage()


def _fork_and_call(action, timeout=20):
    """Fork; in the child run ``action`` and exit 0. Returns the child's exit status, or None if it hung."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            action()
            os._exit(0)
        except BaseException:  # noqa: BLE001 - the exit code is the report
            os._exit(1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def test_a_fork_while_another_thread_holds_the_clients_locks_does_not_hang_the_child(registry):
    registry.register("web", "127.0.0.1", 1)
    registry.register("api", "127.0.0.1", 2)
    client = DiscoveryClient(strategy="round-robin", listen=False, breaker_failures=1)
    instance = client.resolve("web")
    held, release = threading.Event(), threading.Event()

    def hold_every_lock():
        with client.breakers._lock, client._lock, client.strategy._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_every_lock)
    holder.start()
    assert held.wait(10)
    try:
        def in_child():
            client.report(instance, ok=False)  # the breaker's lock
            client.invalidate("web")  # the client's lock
            assert client.resolve("api").port == 2  # a new service: the strategy's lock
        status = _fork_and_call(in_child)
    finally:
        release.set()
        holder.join(10)
    assert status == 0, "the forked child hung on a lock held by a thread it did not inherit" if status is None else status


def test_aresolve_does_not_block_the_event_loop_on_a_cache_miss(registry, redis, settings):
    settings.DISCOVERY = {"REDIS_TIMEOUT": 10}  # the pause below is a slow Redis, not a dead one
    registry.register("web", "127.0.0.1", 1)
    client = DiscoveryClient(listen=False)

    async def scenario():
        ticks_while_resolving = 0
        redis.execute_command("CLIENT", "PAUSE", 1500, "ALL")  # the registry hangs for 1.5 s
        task = asyncio.ensure_future(client.aresolve("web"))
        while not task.done():
            await asyncio.sleep(0.01)
            if not task.done():
                ticks_while_resolving += 1
        return await task, ticks_while_resolving

    instance, ticks = asyncio.run(scenario())
    assert instance.port == 1
    assert ticks > 0, "the event loop was blocked for the whole registry fetch"
    # Once cached, aresolve answers on the loop itself (no thread hop).
    assert asyncio.run(client.aresolve("web")).port == 1
    client.close()
