"""Prometheus counters of Django Tasks run on Shoal (streams_app.tasks), labelled by task and queue.

``task`` is the task function's import path and ``queue`` its queue name: both come from the
project's code and TASKS, so the series stay few. streams_app/tasks/counting.py counts them from
Django's task signals, in the process where each happens: ``enqueued`` where ``enqueue`` is called
(the web tier's /metrics), ``started``, ``succeeded`` and ``failed`` in the consumers
(``runconsumer --metrics-port``), summed across processes as the consumers' metrics are
(streams_app/metrics/consumer.py, multiprocess.py).
"""
from prometheus_client import Counter

LABELS = ("task", "queue")

enqueued = Counter("shoal_tasks_enqueued_total", "Tasks enqueued (with OPTIONS OUTBOX, once their transaction "
                   "commits).", LABELS)
started = Counter("shoal_tasks_started_total", "Task attempts started (a retry or a takeover is another one).",
                  LABELS)
succeeded = Counter("shoal_tasks_succeeded_total", "Tasks whose result became SUCCESSFUL.", LABELS)
failed = Counter("shoal_tasks_failed_total", "Tasks whose result became FAILED (after their retries, if any).",
                 LABELS)
refused = Counter("shoal_tasks_refused_total", "Task messages refused unrun (a task path that is not a Task of an "
                  "imported module, a backend that is not a StreamsBackend, a malformed message), by the "
                  "backend of the consumer that read them: the path in such a message is not to be trusted "
                  "as a label.", ("backend",))
