"""Handlers whose behaviour the payload chooses, and which record what they did in Redis.

``started:<stream>:<group>`` and ``handled:<stream>:<group>`` are lists of entry ids (RPUSH), so a
test counts handlings and duplicates exactly. Payload keys: ``sleep`` (seconds), ``fail`` (raise).
"""
import time

from streams_app import consumer
from streams_app.connection import get_connection


def record(kind, message):
    get_connection().rpush(f"{kind}:{message.stream}:{message.group}", message.id)


def behave(message):
    payload = message.payload if isinstance(message.payload, dict) else {}
    record("started", message)
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("fail"):
        raise RuntimeError(f"asked to fail: {payload.get('fail')}")
    record("handled", message)


consumer("jobs", group="a")(behave)
consumer("jobs", group="b")(behave)
consumer("queue:order-processing", group="workers")(behave)


@consumer("noop", group="bench")
def noop(message):
    pass

