"""Per-task retries (docs/tasks.md, "Retries"): ``max_attempts``, ``backoff`` and ``retry_on`` on a Task.

``ShoalTask`` is StreamsBackend's ``task_class``: Django's ``@task(...)`` hands it the keyword arguments
it does not know itself, so ``@task(max_attempts=5)`` (Django's decorator or ``streams_app.tasks.task``)
makes a Task that carries them, and ``.using(...)`` (a dataclasses.replace) keeps them. A worker reads
them from the Task in its own code, never from the message.

An attempt that raises one of ``retry_on`` (default: every Exception), or ``Retry``, runs again after
``backoff(attempt)`` seconds while attempts are left: the runner publishes the task's message again,
deferred (``publish(..., run_after=)``), and acks the one that failed, so a waiting retry holds no
worker thread and no pending entry (streams_app/tasks/runner.py). Its result is READY meanwhile, with
the error of each attempt so far.
"""
import random
from dataclasses import dataclass
from typing import Any

from streams_app.tasks.api import InvalidTask, Task
from streams_app.tasks.options import attempts_problem, backoff_problem, seconds as _seconds, timeout_problem

# OPTIONS["BACKOFF"]'s default, and what exponential() gives with no arguments: 1, 2, 4 ... seconds, at most 5 min.
DEFAULT_BASE, DEFAULT_CAP = 1.0, 300.0


class Retry(Exception):
    """Raised by a task to be run again (while it has attempts left): after ``after`` seconds, else after
    its backoff. Retried whatever ``retry_on`` says; its attempt counts as one."""

    def __init__(self, after=None, reason=""):
        if after is not None and not _seconds(after):
            raise ValueError(f"Retry(after=...) takes seconds, 0 or more, not {after!r}")
        self.after = after
        super().__init__(reason or (f"retry asked for, after {after} s" if after is not None else "retry asked for"))


class BackoffError(Exception):
    """A task's backoff could not say when to retry (it raised, or returned what is not seconds): the task
    is FAILED with this error after the attempt's own, rather than retried at a made-up time."""


def exponential(base=DEFAULT_BASE, cap=DEFAULT_CAP, jitter=True):
    """A backoff: ``base * 2 ** (attempt - 1)`` seconds, at most ``cap``; with ``jitter`` a random time
    between 0 and that ("full jitter"), so tasks that failed together do not all retry together."""
    if not _seconds(base) or not _seconds(cap):
        raise ValueError(f"exponential() takes seconds, 0 or more: base={base!r}, cap={cap!r}")

    def backoff(attempt):
        delay = min(cap, base * 2 ** min(attempt - 1, 64))
        return random.uniform(0, delay) if jitter else delay

    backoff.__qualname__ = f"exponential(base={base}, cap={cap}, jitter={jitter})"
    return backoff


SHOAL_ARGUMENTS = ("max_attempts", "backoff", "retry_on", "timeout")
"""What ShoalTask adds to Django's Task."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShoalTask(Task):
    max_attempts: int | None = None
    """Attempts in all, 1 or more (1: never retried); None: OPTIONS["MAX_ATTEMPTS"]."""

    backoff: Any = None
    """Seconds before a retry, or a callable from the attempt number (1 after the first failure) to
    seconds; None: OPTIONS["BACKOFF"]."""

    retry_on: Any = None
    """The exception classes that are retried (a class or a tuple); None: every Exception."""

    timeout: Any = None
    """Seconds one attempt may run, more than 0 (streams_app/tasks/timelimits.py); None: OPTIONS["TIMEOUT"]."""

    def __post_init__(self):
        Task.__post_init__(self)  # the backend's validate_task (no zero-argument super() in a slots dataclass)
        given = [name for name in SHOAL_ARGUMENTS if getattr(self, name) is not None]
        backend = self.get_backend()
        if given and not issubclass(getattr(backend, "task_class", Task), ShoalTask):
            # .using(backend="other") onto a backend that would ignore them: said, not dropped.
            raise InvalidTask(f"Task {self.module_path}: {', '.join(given)} {'needs' if len(given) == 1 else 'need'} "
                              f"a StreamsBackend; backend {self.backend!r} is {type(backend).__name__}.")


def validate(task):
    """InvalidTask, said plainly, for a ShoalTask's retry arguments that cannot work."""
    if not isinstance(task, ShoalTask):
        return
    problem = (attempts_problem(task.max_attempts) if task.max_attempts is not None else None) or (
        backoff_problem(task.backoff) if task.backoff is not None else None) or (
        timeout_problem(task.timeout) if task.timeout is not None else None)
    if problem is None and task.retry_on is not None:
        classes = task.retry_on if isinstance(task.retry_on, tuple) else (task.retry_on,)
        if not classes or not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
            problem = f"retry_on must be an exception class or a tuple of them, not {task.retry_on!r}"
    if problem is not None:
        raise InvalidTask(f"Task {task.module_path}: {problem}.")


def policy(task, config):
    """(max_attempts, backoff, retry_on) of ``task`` under its backend's ``config``."""
    attempts = getattr(task, "max_attempts", None) or config["MAX_ATTEMPTS"]
    backoff = getattr(task, "backoff", None)
    if backoff is None:
        backoff = config["BACKOFF"]
    retry_on = getattr(task, "retry_on", None) or (Exception,)
    return attempts, backoff, retry_on if isinstance(retry_on, tuple) else (retry_on,)


def timeout(task, config):
    """Seconds one attempt of ``task`` may run under its backend's ``config``, or None: no limit."""
    seconds = getattr(task, "timeout", None)
    return config["TIMEOUT"] if seconds is None else seconds


def delay(backoff, attempt, exc):
    """Seconds before the retry after failed attempt number ``attempt``; BackoffError when ``backoff``
    cannot say."""
    if isinstance(exc, Retry) and exc.after is not None:
        return float(exc.after)
    if backoff is None:
        backoff = exponential()
    if not callable(backoff):
        return float(backoff)
    try:
        seconds = backoff(attempt)
    except Exception as problem:
        raise BackoffError(f"the task's backoff {backoff!r} raised {type(problem).__name__}: {problem} "
                           f"for attempt {attempt}; the task was not retried") from problem
    if not _seconds(seconds):
        raise BackoffError(f"the task's backoff {backoff!r} returned {seconds!r} for attempt {attempt}, not "
                           "seconds (a number, 0 or more); the task was not retried")
    return float(seconds)
