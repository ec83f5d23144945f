"""A handler that records publish-to-start latency. The payload carries ``t``, the publisher's time.time()."""
import asyncio
import functools
import gc
import itertools
import json
import os
import threading
import time

from streams_app import consumer
from streams_app.redis.connection import get_connection

_pending = []
_lock = threading.Lock()
_flusher = None


def _flush_forever():
    conn = get_connection()
    while True:
        time.sleep(0.2)
        with _lock:
            batch, _pending[:] = list(_pending), []
        if batch:
            conn.rpush("bench:latency", *batch)


@consumer("latency", group="bench")
def measure(message):
    started = time.time()
    global _flusher
    with _lock:
        _pending.append(f"{(started - message.payload['t']) * 1000:.3f}")
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_forever, daemon=True)
            _flusher.start()


@consumer("recovery", group="bench")
def slow_first_time(message):
    """bench/recovery.py: the first delivery hangs (the worker is killed holding it); takeovers are quick."""
    if message.deliveries == 1:
        time.sleep(600)
    get_connection().rpush(f"handled:{message.stream}:{message.group}", message.id)


# bench/io_wait.py: handlers that wait on I/O (payload "wait" seconds), as a call to another service would.

@consumer("iowait", group="sync")
def wait_sync(message):
    time.sleep(message.payload["wait"])


@consumer("iowait", group="async")
async def wait_async(message):
    await asyncio.sleep(message.payload["wait"])


def does_nothing(message):
    pass


# bench/ordered.py: the same no-op handler in the default (shared) mode and in ordered mode.
consumer("ordbench", group="shared")(does_nothing)
consumer("ordbench", group="ordered", ordered=True)(does_nothing)


# bench/realistic.py: handlers doing real work, each recording "publish time, done time" of its message.

_done = []
_done_lock = threading.Lock()
_done_flusher = None


def _flush_done_forever():
    conn = get_connection()
    while True:
        time.sleep(0.02)
        with _done_lock:
            batch, _done[:] = list(_done), []
        if batch:
            conn.rpush("bench:done", *batch)


def record_done(message):
    done = time.time()
    global _done_flusher
    with _done_lock:
        _done.append(f"{message.payload['t']:.6f} {done:.6f}")
        if _done_flusher is None:
            _done_flusher = threading.Thread(target=_flush_done_forever, daemon=True)
            _done_flusher.start()


def io_wait_work(payload):
    time.sleep(0.001)


def cpu_work(payload):
    """About 1 ms of pure-Python computing on this machine (parsing, scoring...): it holds the GIL throughout."""
    total = 0
    for i in range(25_000):
        total += i * i % 7
    return total


def orm_work(payload):
    from tests.testapp.models import Effect

    Effect.objects.create(name="bench", entry_id=str(payload["n"]))


@consumer("real_sleep", group="bench")
def realistic_sleep(message):
    io_wait_work(message.payload)
    record_done(message)


@consumer("real_cpu", group="bench")
def realistic_cpu(message):
    cpu_work(message.payload)
    record_done(message)


@consumer("real_orm", group="bench")
def realistic_orm(message):
    orm_work(message.payload)
    record_done(message)


@consumer("footprint", group="bench")
def note_first(message):
    """bench/footprint.py: when each message was handled (the first one times start-up)."""
    if message.payload.get("first"):
        get_connection().rpush("bench:first", f"{time.time():.6f}")


# bench/tasks.py: the plain @consumer side of Shoal's task backend against its own consumer.
consumer("tasks_noop", group="bench")(does_nothing)


@consumer("tasks_sleep", group="bench")
def sleep_1ms(message):
    time.sleep(0.001)


@consumer("tasks_sleep_async", group="bench")
async def sleep_1ms_async(message):
    await asyncio.sleep(0.001)


# bench/throughput.py: a no-op handler that times itself from inside, so start-up (imports, Django,
# group creation) stays out of the steady rate and the CPU per message. BENCH_TOTAL says how many
# messages the run has; next() on itertools.count is atomic under the GIL, so threads need no lock.

_steady_count = itertools.count(1)
_steady_first = None


@consumer("noop", group="steady")
def steady(message):
    global _steady_first
    n = next(_steady_count)
    if n == 1:
        if os.environ.get("BENCH_GC_FREEZE"):  # throughput.py --gc-freeze: what gc.freeze() after start-up saves
            gc.freeze()
        _steady_first = (time.monotonic(), time.process_time())
    elif n == _steady_total():
        end = (time.monotonic(), time.process_time())
        get_connection().rpush("bench:steady", json.dumps({"first": _steady_first, "last": end, "handled": n}))


@functools.cache
def _steady_total():
    return int(os.environ.get("BENCH_TOTAL", "0"))
