"""System checks of the TASKS entries whose BACKEND is streams_app.tasks.StreamsBackend (ids E060-E063; their
periodic tasks E064-E068, streams_app/tasks/periodic/entries.py; the installed apps' tasks modules E069)."""
import importlib
import importlib.util
import traceback

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Warning, register

from streams_app.redis.names import validate_stream_name
from streams_app.tasks import messages, options
from streams_app.tasks.setup import streams_backends

HINT = "See docs/tasks.md, \"Settings\"."


@register()
def check_tasks_settings(app_configs=None, **kwargs):
    errors = []
    owners = {}
    for alias, params in streams_backends():
        where = f"TASKS[{alias!r}]"
        errors += [Error(f"{where}['OPTIONS']: {problem}.", hint=HINT, id="streams_app.E060")
                   for problem in options.problems(params.get("OPTIONS", {}))]
        given = params.get("OPTIONS") or {}
        if isinstance(given, dict) and "MAX_RETRIES" in given and "MAX_ATTEMPTS" not in given:
            errors.append(Warning(f"{where}['OPTIONS']['MAX_RETRIES'] is deprecated.",
                                  hint=f"Write MAX_ATTEMPTS = {given['MAX_RETRIES'] + 1 if isinstance(given['MAX_RETRIES'], int) else 'n + 1'} "
                                       "instead (attempts in all, as @task(max_attempts=) counts them); it means "
                                       "the same. See docs/tasks.md, \"Retries\".", id="streams_app.W060"))
        database = given.get("DATABASE", "default") if isinstance(given, dict) else "default"
        if isinstance(database, str) and database not in settings.DATABASES:  # else the first outbox enqueue fails
            errors.append(Error(f"{where}['OPTIONS']['DATABASE'] names no database: {database!r} is not in DATABASES.",
                                hint=f"Known: {', '.join(settings.DATABASES) or 'none'}. The outbox is written "
                                     "to that database in the caller's transaction.", id="streams_app.E060"))
        errors += [Error(f"{where} has an unknown key {name!r}.", hint="Known: BACKEND, QUEUES, OPTIONS.",
                         id="streams_app.E061") for name in params if name not in ("BACKEND", "QUEUES", "OPTIONS")]
        queues = params.get("QUEUES", ["default"])
        if not isinstance(queues, (list, tuple)) or not queues or not all(isinstance(q, str) for q in queues):
            errors.append(Error(f"{where}['QUEUES'] must be a non-empty list of queue names, not {queues!r}.",
                                hint=HINT, id="streams_app.E062"))
            continue
        for queue in queues:
            problem = _bad_queue(queue)
            if problem:
                errors.append(Error(f"{where}['QUEUES']: {problem}", hint=HINT, id="streams_app.E062"))
            elif queue in owners:
                errors.append(Error(f"{where}['QUEUES'] and TASKS[{owners[queue]!r}] both name queue {queue!r}: "
                                    f"both would be the stream {messages.stream_name(queue)!r}.",
                                    hint="Give each backend its own queue names.", id="streams_app.E063"))
            owners.setdefault(queue, alias)
        errors += _periodic_errors(alias, params)
    if owners:
        errors += _tasks_module_errors()
    return errors


def _tasks_module_errors():
    """An installed app's ``tasks`` module that fails to import (a ``@task(timeout=0)`` raises InvalidTask
    there): said now, not by every message of its tasks failing with TaskRefused and dead-lettered once
    workers run."""
    errors = []
    for config in apps.get_app_configs():
        name = f"{config.name}.tasks"
        try:
            if importlib.util.find_spec(name) is None:
                continue
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 -- whatever stops the import is the error to show
            where = traceback.extract_tb(exc.__traceback__)[-1]
            errors.append(Error(f"{name} fails to import: {type(exc).__name__}: {exc}",
                                hint=f"At {where.filename}:{where.lineno}. Until it imports, every task message "
                                     "of it is refused (FAILED, dead-lettered) by the workers.", id="streams_app.E069"))
    return errors


def _periodic_errors(alias, params):
    table = (params.get("OPTIONS") or {}).get("PERIODIC") if isinstance(params.get("OPTIONS"), dict) else None
    if table is None:
        return []
    if not isinstance(table, dict):
        return [Error(f"TASKS[{alias!r}]['OPTIONS']['PERIODIC'] must be a dict of names to periodic tasks, not "
                      f"{type(table).__name__}.", hint="See docs/tasks.md, \"Periodic tasks\".", id="streams_app.E064")]
    from streams_app.tasks.periodic.entries import problems  # imports Django's Tasks API: only when used

    return [Error(message, hint=hint, id=f"streams_app.{check}")
            for name, spec in table.items() for check, message, hint in problems(alias, params, name, spec)]


def _bad_queue(queue):
    if not queue or any(char.isspace() or char == ":" for char in queue):
        return f"queue name {queue!r} must be non-empty, without whitespace or ':' (':high' and ':low' name its bands)."
    try:
        validate_stream_name(messages.stream_name(queue))
    except Exception as exc:  # PublishError: the stream name it would be cannot be one
        return f"queue name {queue!r}: {exc}"
    return None
