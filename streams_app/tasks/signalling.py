"""Whether a Django task signal is listened to: the backend and the runner build Django's TaskResult
objects for a signal only when something receives them."""
from streams_app.tasks.api import DJANGO_LOG_RECEIVERS


def listened(signal, sender):
    """Whether ``signal`` has a receiver for ``sender`` other than Django's own, which only log a line
    (the caller writes that line itself when its logger is enabled)."""
    sync_receivers, async_receivers = signal._live_receivers(sender)
    return any(receiver not in DJANGO_LOG_RECEIVERS for receiver in (*sync_receivers, *async_receivers))
