"""The task counters (streams_app/metrics/tasks.py), counted by StreamsBackend and its runner where
each step happens: ``enqueued`` when ``enqueue`` returns (with OPTIONS["OUTBOX"], when the caller's
transaction commits: a rolled-back enqueue published nothing, so it is not counted), ``started`` when an
attempt starts, ``succeeded``/``failed`` when a result becomes SUCCESSFUL or FAILED (a raise that will be
retried is neither).

Counted directly, not from Django's task signals: a receiver of our own would make every signal "listened
to", and the runner builds Django's TaskResult objects only for a signal somebody listens to. Each
(task, queue) child of a counter is looked up once per process (``labels()`` takes a lock and builds a
key each time).
"""
from streams_app.metrics import tasks as counters

_children = {}


def _child(counter, task_path, queue):
    found = _children.get((counter, task_path, queue))
    if found is None:
        labels = (task_path,) if queue is None else (task_path, queue)
        found = _children[counter, task_path, queue] = counter.labels(*labels)
    return found


def enqueued(task_path, queue, n=1):
    _child(counters.enqueued, task_path, queue).inc(n)


def started(task_path, queue, n=1):
    _child(counters.started, task_path, queue).inc(n)


def refused(backend):
    _child(counters.refused, backend, None).inc()


def finished(status, task_path, queue, n=1):
    counter = counters.succeeded if status == "SUCCESSFUL" else counters.failed if status == "FAILED" else None
    if counter is not None:
        _child(counter, task_path, queue).inc(n)
