"""Competing consumers on Redis Streams consumer groups.

    from streams_app import publish, consumer

The names are imported lazily so that ``import streams_app`` works before Django is set up.
"""

__version__ = "1.0.0"  # the django-shoal distribution's version (pyproject.toml reads it; CHANGELOG.md)

__all__ = ["publish", "publish_many", "consumer", "Message"]


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
