"""Django Tasks that tests/streams_app/tasks enqueue (with tests.tasks_settings: a StreamsBackend)."""
import asyncio
import os
import threading
import time

from streams_app.tasks.api import TaskContext  # noqa: F401  (documented: the context tasks receive)

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task()
def add(a, b):
    return a + b


@task(queue_name="emails")
def send_email(to, subject="hello"):
    return {"to": to, "subject": subject}


@task()
def fail(reason):
    raise ValueError(reason)


@task()
async def async_add(a, b):
    await asyncio.sleep(0)
    return {"sum": a + b, "thread": threading.current_thread().name}


@task()
async def async_wait(seconds):
    """Many of these at once share the worker's event loop: their waits overlap."""
    started = time.monotonic()
    await asyncio.sleep(seconds)
    return {"started": started, "ended": time.monotonic()}


@task(takes_context=True)
def context_info(context):
    return {"attempt": context.attempt, "id": context.task_result.id}


@task(takes_context=True)
def slow_first_attempt(context, marker):
    """The first attempt says so in ``marker`` and then hangs (the test SIGKILLs its worker); later ones finish."""
    if context.attempt == 1:
        # Written aside, then renamed: the test waits for the file and must never read it half-written.
        with open(f"{marker}.tmp", "w") as out:
            out.write(str(os.getpid()))
        os.replace(f"{marker}.tmp", marker)
        time.sleep(120)
    return {"attempt": context.attempt}


@task()
def note(path, label):
    """Append ``label`` and the time to ``path``: the order and times tasks ran in."""
    with open(path, "a") as out:
        out.write(f"{label} {time.time()}\n")
    return label


@task()
def sleepy(seconds):
    time.sleep(seconds)
    return seconds


def not_a_task():
    return "never run"


@task()
def flush_then(outcome):
    """Redis loses its data while this runs (a FLUSHALL), then it returns ``outcome``, or raises."""
    from streams_app.redis.connection import get_connection

    get_connection().flushdb()
    if outcome == "raise":
        raise ValueError("after the flush")
    return outcome


@task()
def returns(kind):
    """A value no result can hold: an object, or a float JSON has no spelling for."""
    if kind == "itself":
        itself = []
        itself.append(itself)
        return itself
    if kind == "huge":
        return 10 ** 5000  # json.dumps refuses an int of over 4,300 digits, and so does its repr
    if kind == "bad-repr":
        return BadRepr()
    return {"object": object(), "nan": float("nan"), "infinity": float("inf")}[kind]


class BadRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


# -- per-task retries (streams_app.tasks.task; tests/streams_app/tasks/test_retries.py) ---------------

from streams_app.tasks import Retry  # noqa: E402
from streams_app.tasks import task as shoal_task  # noqa: E402


def _runs(path):
    """One more run of the task counting in ``path``: the number of runs so far, this one included."""
    with open(path, "a") as out:
        out.write("x")
    with open(path) as counted:
        return len(counted.read())


@shoal_task(max_attempts=3, backoff=0)
def flaky(path, failures):
    """Raises ConnectionError in its first ``failures`` runs, then returns the number of runs it took."""
    runs = _runs(path)
    if runs <= failures:
        raise ConnectionError(f"run {runs} failed")
    return runs


@shoal_task(max_attempts=2, backoff=5)
def flaky_later(path, failures):
    """flaky, whose retry waits 5 s: long enough to see it wait."""
    runs = _runs(path)
    if runs <= failures:
        raise ConnectionError(f"run {runs} failed")
    return runs


@shoal_task(max_attempts=3, backoff=0, retry_on=(ConnectionError,))
def picky(kind):
    raise {"connection": ConnectionError, "value": ValueError}[kind](kind)


@shoal_task(max_attempts=3, backoff=60)
def asks_again(path):
    """Asks for its retry at once (Retry(after=0)) the first time, whatever its backoff."""
    if _runs(path) == 1:
        raise Retry(after=0, reason="not yet")
    return "done"


def _raising_backoff(attempt):
    raise ZeroDivisionError("backoff bug")


@shoal_task(max_attempts=3, backoff=_raising_backoff)
def backoff_raises():
    raise ConnectionError("the attempt's own error")


@shoal_task(max_attempts=3, backoff=lambda attempt: -1)
def backoff_negative():
    raise ConnectionError("the attempt's own error")


@shoal_task(timeout=2)
def overruns(path, seconds):
    """Notes its start in ``path``, then sleeps ``seconds``: past its 2 s timeout when that is more."""
    with open(path, "a") as out:
        out.write("started\n")
    time.sleep(seconds)
    with open(path, "a") as out:
        out.write("finished\n")  # never written past the timeout: the worker process is replaced
    return "late"


@shoal_task(timeout=2)
async def async_overruns(path, seconds):
    with open(path, "a") as out:
        out.write("started\n")
    await asyncio.sleep(seconds)
    with open(path, "a") as out:
        out.write("finished\n")
    return "late"


@shoal_task(timeout=1, max_attempts=2, backoff=0)
def overruns_then_succeeds(path):
    """Past its 1 s timeout in its first run; its retry (TaskTimeout is an Exception: retried) returns at once."""
    if _runs(path) == 1:
        time.sleep(30)
    return "second time"


@shoal_task(timeout=0.5)
def raises_its_own_timeout():
    raise TimeoutError("the task's own socket timeout")


@shoal_task(timeout=0.5)
async def async_raises_its_own_timeout():
    raise TimeoutError("the task's own socket timeout")


@shoal_task(timeout=1e10)
def huge_timeout():
    """A limit Condition.wait cannot take in one go: it must not switch the other limits off."""
    return "in time"
