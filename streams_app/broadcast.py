"""Broadcast: a message that every process of the deployment receives, through Redis pub/sub.

    from streams_app.broadcast import broadcast, on_broadcast

    @on_broadcast("prices.reload")
    def reload_prices(data):
        ...

    broadcast("prices.reload", {"region": "eu"})   # every listening process runs reload_prices

Every gunicorn worker listens (gunicorn.conf.py starts a ``Listener`` in ``post_worker_init``), and so
does any process that calls ``start_listener()``. Nothing relays: gunicorn's master imports no app code
and takes no part, each process subscribes to ``STREAMS["BROADCAST_CHANNEL"]`` itself.

Pub/sub is at most once: a process that is (re)starting while a message is sent misses it. Broadcast
what a process can recompute on its own (caches, log levels); work that must happen goes on a stream.

Built-in types: ``ping`` (each receiver writes its pid into the hash ``data["reply_to"]``, which is how
``manage.py broadcast ping`` lists the live processes) and ``log_level`` (set the level of the loggers
the installed apps named with ``shoal_common.broadcasting.add_loggers``, ``{"level": "DEBUG"}``,
optionally ``"logger": name``). Other apps register their own types from their ``AppConfig.ready()``
(discovery_app: ``discovery.invalidate``) through ``shoal_common.broadcasting.on_broadcast``.
"""
import json
import logging
import os
import socket
import threading
import time
import uuid

from shoal_common.broadcasting import _handlers, dispatch, handlers_for, on_broadcast, shoal_loggers  # noqa: F401
from shoal_common.pubsub import Subscriber
from streams_app.conf import setting
from streams_app.redis.connection import get_connection, node_client
from streams_app.exceptions import BroadcastError

logger = logging.getLogger("streams_app.broadcast")

PING_REPLY_TTL = 60  # seconds a ping's reply hash outlives the ping


def encode(type, data=None):
    if not isinstance(type, str) or not type.strip():
        raise BroadcastError(f"broadcast type must be a non-empty string, not {type!r}")
    envelope = {
        "type": type,
        "data": data,
        "id": uuid.uuid4().hex,
        "sender": f"{socket.gethostname()}:{os.getpid()}",
        "sent_at": int(time.time() * 1000),
    }
    try:
        body = json.dumps(envelope, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BroadcastError(f"broadcast data is not JSON-serialisable: {exc}") from None
    try:
        body.encode("utf-8")
    except UnicodeEncodeError as exc:
        # Escaped as \\ud800 it would be sent, and every receiver would fail on it (a reply key, a name).
        raise BroadcastError(f"broadcast data is not valid Unicode: it holds a lone surrogate "
                             f"{body[exc.start]!r}, which UTF-8 cannot encode") from None
    return body


def _object(type, data, required=False):
    if data is None and not required:
        return {}
    if not isinstance(data, dict):
        raise BroadcastError(f"{type} data must be a JSON object, not {json.dumps(data)}"
                             + (f"; e.g. {EXAMPLES[type]}" if type in EXAMPLES else ""))
    return data


def _optional_text(type, data, key):
    value = data.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise BroadcastError(f"{type}: {key} must be a non-empty string, not {value!r}")


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _check_log_level(data):
    if data is None:
        raise BroadcastError(f"log_level needs data, e.g. {EXAMPLES['log_level']}")
    data = _object("log_level", data)
    level = data.get("level")
    # NOTSET is a number to logging but would make a logger defer to its parent, not set a level.
    if not isinstance(level, str) or level.upper() not in LEVELS:
        raise BroadcastError(f"log_level: {level!r} is not a logging level; use DEBUG, INFO, WARNING, ERROR or CRITICAL")
    _optional_text("log_level", data, "logger")


def _check_ping(data):
    _optional_text("ping", _object("ping", data), "reply_to")


def _check_invalidate(data):
    _optional_text("discovery.invalidate", _object("discovery.invalidate", data), "service")


EXAMPLES = {"log_level": '{"level": "DEBUG"}', "discovery.invalidate": '{"service": "order-service"}'}
# The built-in types' handlers are in every process; bad data for them would only be logged there,
# one warning per process, while the sender was told it was delivered. Refuse it before sending.
VALIDATORS = {"log_level": _check_log_level, "ping": _check_ping, "discovery.invalidate": _check_invalidate}


def broadcast(type, data=None, *, pipeline=None):
    """Send ``data`` to the handlers of ``type`` in every listening process.

    Data of the built-in types is checked first (BroadcastError). Returns how many processes were
    subscribed (None when queued on ``pipeline``).
    """
    if type in VALIDATORS:
        VALIDATORS[type](data)
    body = encode(type, data)
    channel = setting("BROADCAST_CHANNEL")
    # On a cluster, PUBLISH reaches every node's subscribers but counts only its own node's: sent
    # to the channel's node, where every listener subscribes (by the channel's slot), the count is right.
    conn = pipeline if pipeline is not None else node_client(get_connection(), channel)
    receivers = conn.publish(channel, body)
    return None if pipeline is not None else receivers


class Listener(Subscriber):
    """Subscribes to the broadcast channel and runs handlers, until ``stop()``; survives Redis outages."""

    def __init__(self, channel=None):
        super().__init__(channel or setting("BROADCAST_CHANNEL"), get_connection, dispatch,
                         name="shoal-broadcast", log=logger)


_listener = None
_listener_lock = threading.Lock()


def start_listener():
    """Start this process's listener, once per process (a forked child starts its own)."""
    global _listener
    with _listener_lock:
        if _listener is None or _listener.pid != os.getpid() or not _listener.is_alive():
            _listener = Listener()
            _listener.pid = os.getpid()
            _listener.start()
        return _listener


def stop_listener(timeout=2.0):
    global _listener
    with _listener_lock:
        if _listener is not None and _listener.pid == os.getpid():
            _listener.stop(timeout)
        _listener = None


# -- built-in handlers ----------------------------------------------------------------------


@on_broadcast("ping")
def reply_to_ping(data):
    key = (data or {}).get("reply_to")
    if not key:
        return
    pipe = get_connection().pipeline()
    pipe.hset(key, str(os.getpid()), json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "ppid": os.getppid()}))
    pipe.expire(key, PING_REPLY_TTL)
    pipe.execute()


@on_broadcast("log_level")
def set_log_level(data):
    data = data or {}
    level = str(data.get("level", "")).upper()
    if not isinstance(logging.getLevelName(level), int):
        logger.warning("Broadcast: log_level %r is not a logging level", data.get("level"))
        return
    names = [data["logger"]] if data.get("logger") else shoal_loggers()
    for name in names:
        logging.getLogger(name).setLevel(level)
    logger.info("Broadcast: log level of %s set to %s", ", ".join(names), level)
