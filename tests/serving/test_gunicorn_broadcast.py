"""A broadcast reaches every worker of a real gunicorn master, and nobody else has to relay it."""
import json
import os

import pytest

from streams_app.broadcast import broadcast
from streams_app.redis.connection import node_client
from tests.conftest import ConsumerProcess
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.both_redis]


def test_every_gunicorn_worker_acknowledges_a_broadcast(gunicorn, redis):
    server = gunicorn(workers=3)
    channel = "shoal:broadcast"
    wait_for(lambda: dict(node_client(redis, "shoal:broadcast").pubsub_numsub(channel)).get(channel) == 3, timeout=30, what="3 workers subscribed")

    assert broadcast("ping", {"reply_to": "acks"}) == 3
    wait_for(lambda: redis.hlen("acks") == 3, timeout=10, what="3 acknowledgements")
    acks = {int(pid): json.loads(body) for pid, body in redis.hgetall("acks").items()}
    assert sorted(acks) == server.worker_pids()
    assert {ack["ppid"] for ack in acks.values()} == {server.proc.pid}


def test_the_broadcast_command_lists_the_processes_that_replied(gunicorn, redis_server, redis):
    server = gunicorn(workers=3)
    wait_for(lambda: dict(node_client(redis, "shoal:broadcast").pubsub_numsub("shoal:broadcast")).get("shoal:broadcast") == 3, timeout=30,
             what="3 workers subscribed")
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url, "PYTHONUNBUFFERED": "1"}
    command = ConsumerProcess(["ping", "--wait", "5"], {**os.environ, **env}, command="broadcast")
    assert command.wait(60) == 0, command.output()
    output = command.output()
    assert "delivered to 3 listening process(es)" in output
    assert "3 of 3 replied" in output
    for pid in server.worker_pids():
        assert f"pid {pid} (parent {server.proc.pid})" in output
