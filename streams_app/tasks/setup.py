"""Declare the consumers of each queue of each StreamsBackend in TASKS, at app ready, so ``runconsumer``
with no arguments runs them beside the ``@consumer`` handlers: ``tasks:<queue>:workers`` (sync tasks,
in handler threads) and ``tasks:<queue>:async:workers`` (``async def`` tasks, on the event loop),
each in three priority bands."""
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from streams_app.registry import consumer
from streams_app.tasks import messages, options

BACKEND_PATH = "streams_app.tasks.StreamsBackend"


def streams_backends():
    """(alias, params) of each TASKS entry whose BACKEND is Shoal's."""
    configured = getattr(settings, "TASKS", None) or {}
    if not isinstance(configured, dict):
        return []
    return [(alias, params) for alias, params in configured.items()
            if isinstance(params, dict) and params.get("BACKEND") == BACKEND_PATH]


def queues(params):
    return list(params.get("QUEUES") or ["default"])


def install():
    """Register the queues' consumers; idempotent (the registry accepts the same handler twice).

    A backend whose settings are wrong is left out rather than raising here, at app ready: the
    system checks (E060-E063) then say what is wrong, with a hint, instead of a registry error."""
    backends = streams_backends()
    if not backends:
        return
    try:
        from streams_app.tasks.awaiting import AsyncQueueHandler
        from streams_app.tasks.runner import QueueHandler
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"TASKS names {BACKEND_PATH}, but Django's Tasks API is missing ({exc}): Django 6 has django.tasks; "
            "on Django 5.2 install the backport: pip install 'django-shoal[tasks]' (docs/tasks.md)") from exc
    owners = set()
    for alias, params in backends:
        if options.problems(params.get("OPTIONS", {})) or not options.valid_queues(params):
            continue  # the system checks (E060, E062) report it, and runconsumer does not start on them
        config = options.merged(params.get("OPTIONS"))
        for queue in queues(params):
            if queue in owners:
                continue  # a second backend naming the queue: E063
            owners.add(queue)
            handler = QueueHandler(alias)
            handler.shoal_handler_name = f"Django tasks (queue {queue}, backend {alias})"  # the admin's Handler
            consumer(messages.stream_name(queue), group=messages.GROUP, max_deliveries=config["MAX_DELIVERIES"],
                     bands=messages.BANDS, idempotent=config["IDEMPOTENT"])(handler)
            # async def tasks on the worker's event loop; the "db" guard needs a sync handler's transaction.
            run_async = AsyncQueueHandler(alias)
            run_async.shoal_handler_name = f"Django tasks (queue {queue}, async tasks, backend {alias})"
            consumer(messages.async_stream_name(queue), group=messages.GROUP, max_deliveries=config["MAX_DELIVERIES"],
                     bands=messages.BANDS, idempotent="redis" if config["IDEMPOTENT"] else None,
                     )(run_async)
