"""Handlers whose behaviour the payload chooses, and which record what they did in Redis.

``started:<stream>:<group>`` and ``handled:<stream>:<group>`` are lists of entry ids (RPUSH), so a
test counts handlings and duplicates exactly. Payload keys: ``sleep`` (seconds), ``fail`` (raise).
"""
import os
import signal
import time
import zlib

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


# -- failure handling (tests/streams_app/test_failures.py and friends) ------------------------

FAILING_CALLS = []  # (entry id, delivery, monotonic time): in-process loop tests read it


@consumer("failing", group="g", max_deliveries=4, retry_backoff=(0.2, 5))
def always_fails(message):
    FAILING_CALLS.append((message.id, message.deliveries, time.monotonic()))
    record("started", message)
    raise ValueError(f"cannot handle {message.payload!r}")


@consumer("suicide", group="g", max_deliveries=3)
def kills_its_process(message):
    """Dies mid-handler, as a segfault or the OOM killer would: no error is ever recorded."""
    record("started", message)
    os.kill(os.getpid(), signal.SIGKILL)


@consumer("idem", group="r", idempotent="redis", retry_backoff=0.05)
def idempotent_in_redis(message):
    behave(message)


@consumer("dbjobs", group="d", idempotent="db")
def idempotent_in_db(message):
    """Writes an Effect row; ``die_after_commit`` SIGKILLs the worker after the commit, before the ack."""
    from django.db import transaction

    from tests.testapp.models import Effect

    record("started", message)
    Effect.objects.create(name=message.payload["name"], entry_id=message.id)
    if message.payload.get("die_after_commit") and message.deliveries == 1:
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))


consumer("ledger", group="fast", retention="acked")(behave)
consumer("ledger", group="slow")(behave)


# -- the chaos run (tests/chaos) ---------------------------------------------------------------

CHAOS_STREAM = "chaos"


def chaos_fails(key):
    """A deterministic 1% of keys: the same in every process, every run (not Python's salted hash)."""
    return zlib.crc32(key.encode()) % 100 == 0


@consumer(CHAOS_STREAM, group="effects", idempotent="db", retry_backoff=(0.05, 1))
def chaos_effect(message):
    """One Effect row per key, written in the same transaction as the ProcessedMessage guard."""
    from tests.testapp.models import Effect

    Effect.objects.create(name=message.key, entry_id=message.id)


@consumer(CHAOS_STREAM, group="flaky", max_deliveries=3, retry_backoff=(0.05, 1))
def chaos_flaky(message):
    if chaos_fails(message.key):
        raise RuntimeError(f"key {message.key} always fails")
    get_connection().hincrby("chaos:flaky:handled", message.key, 1)
