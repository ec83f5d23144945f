"""The periodic tasks of TASKS[alias]["OPTIONS"]["PERIODIC"]: read into ``Entry`` objects, and what is wrong
with them, for the system checks (streams_app/tasks/checks.py, E064-E068; docs/tasks.md "Periodic tasks").

``PERIODIC = {name: {"task": "app.tasks.fn", "cron": "*/5 * * * *" | "every": seconds, "args": [...],
"kwargs": {...}, "queue_name": ..., "priority": ..., "timezone": "Europe/Paris", "catch_up": "latest"}}``
"""
import json
import math
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

from streams_app.exceptions import RejectMessage
from streams_app.tasks import setup
from streams_app.tasks.lookup import find_task
from streams_app.tasks.periodic.schedule import Cron, Every

KEYS = ("task", "cron", "every", "args", "kwargs", "queue_name", "priority", "timezone", "catch_up")
CATCH_UP = ("latest", "all", "none")
CRON_HINT = "pip install 'django-shoal[periodic]' (croniter), or give the entry \"every\": seconds instead."


@dataclass(frozen=True)
class Entry:
    alias: str
    name: str
    task_path: str
    schedule: object  # schedule.Every or schedule.Cron
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    queue_name: str | None = None
    priority: int | None = None
    catch_up: str = "latest"

    def task(self):
        """The Django Task this entry enqueues, on its backend, queue and priority. RejectMessage
        (TaskRefused) when the path names no Task (its module failed to import, say)."""
        task = find_task(self.task_path)
        changes = {"backend": self.alias}
        if self.queue_name is not None:
            changes["queue_name"] = self.queue_name
        if self.priority is not None:
            changes["priority"] = self.priority
        return task.using(**changes)


def periodic_of(params):
    options = params.get("OPTIONS") or {}
    return options.get("PERIODIC") if isinstance(options, dict) else None


def entries(queues=None):
    """The valid periodic entries of every StreamsBackend in TASKS (those with problems are left out: the
    checks name them); with ``queues``, only those whose queue is among them."""
    found = []
    for alias, params in setup.streams_backends():
        table = periodic_of(params)
        if not isinstance(table, dict):
            continue
        for name, spec in table.items():
            if problems(alias, params, name, spec):
                continue
            entry = build(alias, name, spec)
            if queues is None or queue_of(entry) in queues:
                found.append(entry)
    return found


def queue_of(entry):
    if entry.queue_name is not None:
        return entry.queue_name
    try:
        return find_task(entry.task_path).queue_name
    except RejectMessage:
        return None


def build(alias, name, spec):
    if "cron" in spec:
        schedule = Cron(spec["cron"], spec.get("timezone") or "UTC")
    else:
        schedule = Every(spec["every"])
    return Entry(alias=alias, name=name, task_path=spec["task"], schedule=schedule, args=list(spec.get("args") or []),
                 kwargs=dict(spec.get("kwargs") or {}), queue_name=spec.get("queue_name"),
                 priority=spec.get("priority"), catch_up=spec.get("catch_up", "latest"))


def problems(alias, params, name, spec):
    """What is wrong with the entry ``name``: a list of (check id, message, hint)."""
    where = f"TASKS[{alias!r}]['OPTIONS']['PERIODIC'][{name!r}]"
    found = []

    def add(check, message, hint="See docs/tasks.md, \"Periodic tasks\"."):
        found.append((check, f"{where}: {message}", hint))

    if not isinstance(name, str) or not name or any(char.isspace() or char in "{}/" for char in name):
        # "/": the Schedules page's Run now address holds the name as one path segment.
        add("E064", "a periodic task's name must be a non-empty text without whitespace, braces or '/'.")
    if not isinstance(spec, dict):
        add("E064", f"must be a dict (task, cron or every, ...), not {type(spec).__name__}.")
        return found
    unknown = [key for key in spec if key not in KEYS]
    if unknown:
        add("E064", f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}.",
            f"Known: {', '.join(KEYS)}.")
    if ("cron" in spec) == ("every" in spec):
        add("E064", "give exactly one of \"cron\" (a cron expression) and \"every\" (seconds), not "
                    f"{'both' if 'cron' in spec else 'neither'}.")
    if "every" in spec:
        every = spec["every"]
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not math.isfinite(every) or every < 1:
            # The schedulers pass once a second: "every": 0.001 enqueued 170 runs a second in a trial.
            add("E064", f"\"every\" must be a number of seconds, 1 or more, not {every!r}.")
    if not isinstance(spec.get("args", []), (list, tuple)):
        add("E064", f"\"args\" must be a list, not {type(spec['args']).__name__}.")
    if not isinstance(spec.get("kwargs", {}), dict):
        add("E064", f"\"kwargs\" must be a dict, not {type(spec['kwargs']).__name__}.")
    try:
        json.dumps([spec.get("args", []), spec.get("kwargs", {})], allow_nan=False)
    except (TypeError, ValueError) as exc:
        add("E064", f"\"args\" and \"kwargs\" must be JSON, as for enqueue ({exc}).")
    if spec.get("catch_up", "latest") not in CATCH_UP:
        add("E064", f"\"catch_up\" must be one of {', '.join(map(repr, CATCH_UP))}, not {spec['catch_up']!r}.")
    priority = spec.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                 or not -100 <= priority <= 100):
        add("E064", f"\"priority\" must be a whole number from -100 to 100, not {priority!r}.")
    zone = spec.get("timezone")
    if zone is not None:
        try:
            if not isinstance(zone, str) or not zone:
                raise ValueError
            ZoneInfo(zone)
        except Exception:
            add("E067", f"\"timezone\" {zone!r} is not a time zone of the tz database.",
                "A name such as \"Europe/Paris\" or \"UTC\" (zoneinfo; on a system without tz data: pip install tzdata).")
    if "cron" in spec and "every" not in spec and not any(check == "E067" for check, *_ in found):
        found += [(check, f"{where}: {message}", hint) for check, message, hint in _cron_problems(spec)]
    queue = spec.get("queue_name")
    if queue is not None and queue not in setup.queues(params):
        add("E068", f"\"queue_name\" {queue!r} is not a queue of TASKS[{alias!r}] "
                    f"(QUEUES: {', '.join(map(str, setup.queues(params)))}).",
            "Name one of the backend's QUEUES, or add the queue to them.")
    found += [(check, f"{where}: {message}", hint) for check, message, hint in _task_problems(spec)]
    return found


def _cron_problems(spec):
    expression = spec["cron"]
    try:
        schedule = Cron(expression, spec.get("timezone") or "UTC")
    except ImportError:
        return [("E065", f"\"cron\" {expression!r} needs croniter, which is not installed.", CRON_HINT)]
    except ValueError as exc:
        return [("E065", f"\"cron\": {exc}.", "Five fields: minute hour day-of-month month day-of-week, e.g. "
                                               "\"*/5 * * * *\" (every 5 minutes), \"30 2 * * 1\" (Mondays 02:30).")]
    from streams_app.tasks.periodic.schedule import to_ms
    from django.utils import timezone

    if schedule.next_after(to_ms(timezone.now())) is None:
        return [("E065", f"\"cron\" {expression!r} never fires (no such date comes).",
                 "Check the day of the month against the month (31 February, 30 February never come).")]
    return []


def _task_problems(spec):
    path = spec.get("task")
    if not isinstance(path, str) or "." not in path:
        return [("E066", f"\"task\" must be the dotted path of a Django Task (\"myapp.tasks.send_report\"), "
                         f"not {path!r}.", "See docs/tasks.md, \"Periodic tasks\".")]
    try:
        find_task(path)
    except RejectMessage as exc:
        # The lookup words it for a task message ("...; it was not run"); here it is a setting.
        reason = str(exc).removeprefix(f"task {path!r}: ").removeprefix(f"task {path!r} ")
        for tail in ("; a task message names only tasks, so it was not run", "; it was not run"):
            reason = reason.removesuffix(tail)
        return [("E066", f"\"task\" {path!r}: {reason}.",
                 "A module-level function decorated with @task, in an installed app's module.")]
    return []
