"""Whether a Django task signal is listened to: the backend and the runner build Django's TaskResult
objects for a signal only when something receives them."""
from streams_app.tasks.api import DJANGO_LOG_RECEIVERS


def listened(signal, sender):
    """Whether ``signal`` has a receiver for ``sender`` other than Django's own, which only log a line
    (the caller writes that line itself when its logger is enabled).

    Signal has no public way to list a sender's receivers, so this reads ``_live_receivers`` (Django 5.0
    to 6.1, tested on each in the version matrix). Should a later Django drop or change it, every signal
    counts as listened to: TaskResults are built as Django's own backends build them, slower, never wrong."""
    try:
        sync_receivers, async_receivers = signal._live_receivers(sender)
    except (AttributeError, TypeError, ValueError):
        return True
    return any(receiver not in DJANGO_LOG_RECEIVERS for receiver in (*sync_receivers, *async_receivers))
