"""Competing consumers on Redis Streams consumer groups.

    from streams_app import publish, consumer

The names are imported lazily so that ``import streams_app`` works before Django is set up.
"""

__version__ = "1.0.0"  # the django-shoal distribution's version (pyproject.toml reads it; CHANGELOG.md)

__all__ = ["publish", "publish_many", "consumer", "Message"]


import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names are, for type checkers; at run time they are imported on first use
    from streams_app.publishing.message import Message
    from streams_app.publishing.producer import publish, publish_many
    from streams_app.registry import consumer


def __getattr__(name: str) -> Any:
    if name in ("publish", "publish_many"):
        from streams_app.publishing import producer

        return getattr(producer, name)
    if name == "consumer":
        from streams_app.registry import consumer

        return consumer
    if name == "Message":
        from streams_app.publishing.message import Message

        return Message
    raise AttributeError(f"module 'streams_app' has no attribute {name!r}")


# The modules that moved into rooms (issue 49). Their old paths were documented and are in hosts' code
# and configs (the URLconf's include(), gunicorn's -c python:..., mock targets), so they keep working: an
# old name imports the new module and *is* it (the same object, so a patch through either path patches
# both), with one DeprecationWarning naming the new path.
MOVED = {
    "streams_app.gunicorn_conf": "streams_app.web.gunicorn_conf",
    "streams_app.health": "streams_app.web.health",
    "streams_app.metrics_view": "streams_app.web.metrics_view",
    "streams_app.urls": "streams_app.web.urls",
    "streams_app.app_check": "streams_app.web.app_check",
    "streams_app.producer": "streams_app.publishing.producer",
    "streams_app.scheduled": "streams_app.publishing.scheduled",
    "streams_app.codec": "streams_app.publishing.codec",
    "streams_app.message": "streams_app.publishing.message",
    "streams_app.partitions": "streams_app.partitioning.partitions",
    "streams_app.layout": "streams_app.partitioning.layout",
    "streams_app.drain": "streams_app.partitioning.drain",
    "streams_app.connection": "streams_app.redis.connection",
    "streams_app.keys": "streams_app.redis.keys",
    "streams_app.scripts": "streams_app.redis.scripts",
    "streams_app.entry_ids": "streams_app.redis.entry_ids",
    "streams_app.names": "streams_app.redis.names",
    "streams_app.lag": "streams_app.redis.lag",
    "streams_app.reclaim": "streams_app.operations.reclaim",
    "streams_app.repartition": "streams_app.operations.repartition",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers only for the names of MOVED; every other import goes on to the next finder."""

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> Any:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> ModuleType:
        # Called once per process and old name: afterwards sys.modules[old] is the new module.
        warnings.warn(f"{spec.name} has moved to {MOVED[spec.name]}: import it from there",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        pass  # the new module ran when create_module imported it; it keeps its own name and spec


# First on the path, so a stale copy of an old module left on disk can never be imported instead.
if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())
