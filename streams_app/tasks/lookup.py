"""Finding the Django Task a task message names, without running code the message chose.

A message is data from Redis, not trusted code: its ``task`` path is looked up only in a module that
is already imported or belongs to an installed app, and accepted only if the attribute found there
is a Django ``Task``. Anything else raises RejectMessage (dead-lettered at once, with the reason).
"""
import sys
from importlib import import_module

from django.apps import apps

from streams_app.exceptions import RejectMessage
from streams_app.tasks.api import Task


class TaskRefused(RejectMessage):
    """A task message names no Task this worker may run: dead-lettered at once, and its result's error
    (``exception_class_path`` ``streams_app.tasks.lookup.TaskRefused``)."""


def _importable(module):
    """Whether ``module`` may be imported to find a task: already imported, or in an installed app."""
    if module in sys.modules:
        return True
    return any(module == config.name or module.startswith(config.name + ".") for config in apps.get_app_configs())


_found = {}


def find_task(path):
    """The Django Task at ``path`` ("module.function"); RejectMessage when there is none there.

    A Task found is kept for the process (a worker looks up the same few paths for every message); a
    refusal is not, so a module that failed to import is tried again by the next message."""
    found = _found.get(path)
    if found is None:
        found = _found[path] = _find(path)
    return found


def _find(path):
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not _importable(module_name):
        raise TaskRefused(f"task {path!r} is not in an imported module or an installed app's package; "
                            "it was not run")
    try:
        module = import_module(module_name)
    except Exception as exc:
        raise TaskRefused(f"task {path!r}: importing {module_name} failed ({type(exc).__name__}: {exc}); "
                            "it was not run") from exc
    found = getattr(module, attribute, None)
    if not isinstance(found, Task):
        what = "nothing" if found is None else f"a {type(found).__name__}"
        raise TaskRefused(f"{path!r} is {what}, not a Django Task (@task); a task message names only tasks, "
                            "so it was not run")
    return found
