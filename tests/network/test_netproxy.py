"""The test proxy itself (tests/netproxy.py): each fault does what the network tests rely on."""
import socket
import time

import pytest
import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.waiting import wait_for

ONCE = {"retry": Retry(NoBackoff(), 0)}


def test_pass_forwards_both_ways(net_proxy, redis):
    client = net_proxy.client()
    client.set("k", "v")
    assert redis.get("k") == "v"
    assert client.get("k") == "v"


def test_cut_closes_current_connections_and_new_ones_work(net_proxy):
    client = net_proxy.client(**ONCE)
    connection = client.connection_pool.get_connection()
    connection.send_command("PING")
    connection.read_response()
    net_proxy.cut()
    with pytest.raises(redis_py.ConnectionError):
        connection.send_command("PING")
        connection.read_response()
    assert client.ping()  # a new connection: the proxy still listens


def test_delay_holds_each_reply(net_proxy):
    client = net_proxy.client()
    client.ping()
    net_proxy.delay(300)
    started = time.monotonic()
    client.ping()
    assert time.monotonic() - started >= 0.3 * 2 - 0.05  # request and reply, each held
    net_proxy.heal()
    client.ping()


def _ping(sock):
    sock.sendall(b"PING\r\n")
    return sock.recv(100)


def test_blackhole_forwards_nothing_and_its_connections_stay_dead_after_heal(net_proxy):
    old = socket.create_connection(("127.0.0.1", net_proxy.port), timeout=0.5)
    assert _ping(old) == b"+PONG\r\n"
    net_proxy.blackhole()
    with pytest.raises(TimeoutError):
        _ping(old)
    fresh = socket.create_connection(("127.0.0.1", net_proxy.port), timeout=0.5)  # accepted, then nothing
    with pytest.raises(TimeoutError):
        _ping(fresh)
    assert net_proxy.links == 2  # held open, not closed
    assert net_proxy.stale_sends == 0  # sent during the fault: not a reuse after it
    net_proxy.heal()
    for sock in (old, fresh):
        with pytest.raises(TimeoutError):
            _ping(sock)
    wait_for(lambda: net_proxy.stale_sends == 2, timeout=5, what="both dead connections' sends after the heal counted")
    new = socket.create_connection(("127.0.0.1", net_proxy.port), timeout=2)
    assert _ping(new) == b"+PONG\r\n"
    assert net_proxy.stale_sends == 2
    for sock in (old, fresh, new):
        sock.close()


def test_refuse_closes_the_listener_until_heal(net_proxy):
    net_proxy.refuse()
    with pytest.raises(redis_py.ConnectionError, match="refused|Connection"):
        net_proxy.client(**ONCE).ping()
    net_proxy.heal()
    assert wait_for(lambda: net_proxy.client(socket_timeout=2).ping(), timeout=5, what="the proxy listening again")
