"""The receiving side of broadcasts: which handler runs for which type, and the loggers ``log_level`` sets.

streams_app owns the channel, the sending and the listener thread (streams_app.broadcast); this
registry is shared so that any app registers its own handlers from ``AppConfig.ready()`` without
importing streams_app (discovery_app registers ``discovery.invalidate`` this way), and names its
own loggers for the built-in ``log_level`` broadcast.
"""
import json
import logging

logger = logging.getLogger("streams_app.broadcast")

_handlers = {}
_loggers = []


def on_broadcast(type):
    """Register ``handler(data)`` for broadcasts of ``type``; several handlers per type run in order."""

    def register(handler):
        handlers = _handlers.setdefault(type, [])
        if handler not in handlers:
            handlers.append(handler)
        return handler

    return register


def handlers_for(type):
    return list(_handlers.get(type, ()))


def add_loggers(*names):
    """Loggers that a ``log_level`` broadcast without ``"logger"`` sets (each app adds its own)."""
    for name in names:
        if name not in _loggers:
            _loggers.append(name)


def shoal_loggers():
    return tuple(_loggers)


def dispatch(raw):
    """Run the handlers of one received message. A bad message or a failing handler is only logged."""
    try:
        envelope = json.loads(raw)
        type, data = envelope["type"], envelope.get("data")
    except (ValueError, TypeError, KeyError) as exc:
        logger.warning("Broadcast: ignoring a message that is not a Shoal broadcast (%s): %.200r", exc, raw)
        return
    handlers = handlers_for(type)
    if not handlers:
        logger.debug("Broadcast: no handler for %r in this process", type)
    for handler in handlers:
        try:
            handler(data)
        except Exception:
            logger.exception("Broadcast: handler %s failed on %r", getattr(handler, "__qualname__", handler), type)
