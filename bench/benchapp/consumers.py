"""A handler that records publish-to-start latency. The payload carries ``t``, the publisher's time.time()."""
import asyncio
import threading
import time

from streams_app import consumer
from streams_app.connection import get_connection

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
