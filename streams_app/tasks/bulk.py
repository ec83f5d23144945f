"""``streams_app.tasks.enqueue_many(task, [(args, kwargs), ...])``: many enqueues of one Task, one
round trip per StreamsBackend.BULK_BATCH (500) of them, one TaskResult per task, in order.

Every call is checked first (a Task of a StreamsBackend; args a list or tuple, kwargs a dict, both
JSON), so bad input raises before anything is written. A Redis error mid-way raises EnqueueManyError,
whose ``enqueued`` are the results of the batches written (each batch is one MULTI/EXEC: whole or none).
"""
from streams_app.tasks.api import Task
from streams_app.tasks.backend import StreamsBackend


def enqueue_many(task, calls):
    """Enqueue ``task`` once per (args, kwargs) of ``calls``; returns their TaskResults, in order."""
    if not isinstance(task, Task):
        raise TypeError(f"enqueue_many takes a Django Task (@task), not {type(task).__name__}")
    backend = task.get_backend()
    if not isinstance(backend, StreamsBackend):
        raise TypeError(f"enqueue_many enqueues to a StreamsBackend; the backend {task.backend!r} of "
                        f"{task.module_path} is a {type(backend).__name__}")
    checked = []
    for number, call in enumerate(calls):
        if not isinstance(call, (list, tuple)) or len(call) != 2:
            raise TypeError(f"enqueue_many: call {number} must be an (args, kwargs) pair, not {call!r}")
        args, kwargs = call
        if not isinstance(args, (list, tuple)):
            raise TypeError(f"enqueue_many: the args of call {number} must be a list or tuple, not "
                            f"{type(args).__name__}")
        if not isinstance(kwargs, dict):
            raise TypeError(f"enqueue_many: the kwargs of call {number} must be a dict, not {type(kwargs).__name__}")
        checked.append((args, kwargs))
    return backend.enqueue_many(task, checked)
