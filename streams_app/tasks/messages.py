"""What a task message is: its stream, its group, its payload.

A queue ``Q`` is three streams, one per priority band, read by the consumer group ``workers``:
``tasks:Q:high`` (priority 1 to 100), ``tasks:Q`` (0, the default) and ``tasks:Q:low`` (-100 to -1);
a band is read only while the bands above it have nothing unread (streams_app/consuming/bands.py).
``runconsumer tasks:Q:workers`` selects the queue's three. ``async def`` tasks go to the same three
bands under ``tasks:Q:async`` (``tasks:Q:async:high``...), read by an async consumer on the worker's
event loop (``runconsumer tasks:Q:async:workers``). The payload is a JSON object::

    {"id": result id, "task": "module.function", "backend": alias, "queue": Q, "priority": n,
     "takes_context": bool, "args": [...], "kwargs": {...}}

``args`` and ``kwargs`` are normalised as Django's TaskResult does (tuples become lists, bytes text);
what is not JSON raises TypeError or ValueError at enqueue, before anything is written.
"""
from datetime import datetime

from streams_app.exceptions import RejectMessage
from streams_app.registry import band_stream

STREAM_PREFIX = "tasks"
GROUP = "workers"
# Highest first, as the registry's bands= takes them.
BANDS = ("high", "", "low")


def stream_name(queue):
    """The queue's stream (of priority 0); the consumer's stream, whose bands are its neighbours."""
    return f"{STREAM_PREFIX}:{queue}"


def band(priority):
    return "high" if priority > 0 else "low" if priority < 0 else ""


def async_stream_name(queue):
    """The stream of the queue's ``async def`` tasks (priority 0), read by an async consumer."""
    return f"{stream_name(queue)}:async"


def stream_for(queue, priority=0, is_async=False):
    """The stream a task of ``priority`` on ``queue`` is published to."""
    return band_stream(async_stream_name(queue) if is_async else stream_name(queue), band(priority))


def selector(queue):
    """What ``runconsumer`` takes to run only this queue."""
    return f"{stream_name(queue)}:{GROUP}"


def payload(result):
    """The message of a TaskResult (``result.args``/``kwargs`` are already normalised by Django)."""
    task = result.task
    return {"id": result.id, "task": task.module_path, "backend": result.backend, "queue": task.queue_name,
            "priority": task.priority, "takes_context": task.takes_context, "args": result.args,
            "kwargs": result.kwargs}


def moment(data, name):
    """The aware time a message carries under ``name`` (a periodic tick's ``run_after``, written for a
    worker that finds no result to start), or None when it carries none or none it can read: a result is
    still written then, only without that time."""
    value = data.get(name)
    if not isinstance(value, str):
        return None
    try:
        found = datetime.fromisoformat(value)
    except ValueError:
        return None
    return found if found.tzinfo is not None else None


def parse(data):
    """The fields of a task message; RejectMessage (dead-lettered at once) for anything else."""
    if not isinstance(data, dict):
        raise RejectMessage(f"a task message is a JSON object, not {type(data).__name__}")
    missing = [name for name in ("id", "task", "args", "kwargs") if name not in data]
    if missing:
        raise RejectMessage(f"the task message lacks {', '.join(missing)}")
    if not isinstance(data["id"], str) or not data["id"]:
        raise RejectMessage(f"the task message's id must be a string, not {data['id']!r}")
    if not isinstance(data["task"], str) or "." not in data["task"]:
        raise RejectMessage(f"the task message's task must be a dotted path, not {data['task']!r}")
    if not isinstance(data["args"], list) or not isinstance(data["kwargs"], dict):
        raise RejectMessage("the task message's args must be a list and its kwargs an object")
    return data
