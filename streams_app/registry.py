"""The ``@consumer`` decorator and the table of declared consumers."""
from dataclasses import dataclass, field

from streams_app.exceptions import ConsumerConfigError, PublishError
from streams_app.producer import validate_stream_name

_START_CHOICES = ("0", "$")


@dataclass(frozen=True)
class ConsumerSpec:
    stream: str
    group: str
    handler: object = field(compare=False)
    start: str = "0"
    batch: int | None = None
    max_deliveries: int = 5
    options: dict = field(default_factory=dict, compare=False)

    @property
    def name(self):
        return f"{self.stream}:{self.group}"

    @property
    def handler_path(self):
        return f"{self.handler.__module__}.{self.handler.__qualname__}"


_registry: dict[tuple[str, str], ConsumerSpec] = {}


def consumer(stream, *, group, start="0", batch=None, max_deliveries=5, **options):
    """Register ``handler(message)`` for ``group`` on ``stream``.

    ``start`` is where a new group begins: "0" (the whole stream) or "$" (only new entries).
    """
    try:
        validate_stream_name(stream)
    except PublishError as exc:
        raise ConsumerConfigError(str(exc)) from None
    if not isinstance(group, str) or not group:
        raise ConsumerConfigError(f"group must be a non-empty string, not {group!r}")
    if start not in _START_CHOICES:
        raise ConsumerConfigError(f"start must be '0' or '$', not {start!r}")
    if batch is not None and (not isinstance(batch, int) or batch <= 0):
        raise ConsumerConfigError(f"batch must be a positive integer, not {batch!r}")
    if not isinstance(max_deliveries, int) or max_deliveries <= 0:
        raise ConsumerConfigError(f"max_deliveries must be a positive integer, not {max_deliveries!r}")

    def register(handler):
        spec = ConsumerSpec(stream, group, handler, start, batch, max_deliveries, dict(options))
        existing = _registry.get((stream, group))
        if existing is not None and existing.handler_path != spec.handler_path:
            raise ConsumerConfigError(
                f"{spec.name} already has a handler, {existing.handler_path}; "
                f"{spec.handler_path} cannot be a second one. Use another group name."
            )
        _registry[(stream, group)] = spec
        return handler

    return register


def registered():
    """Every declared consumer, sorted by stream then group."""
    return [_registry[key] for key in sorted(_registry)]


def split_selector(selector):
    """``STREAM:GROUP`` → (stream, group). Stream names contain ':' often, so split at the last one."""
    stream, sep, group = selector.rpartition(":")
    if not sep or not stream or not group:
        raise ConsumerConfigError(f"{selector!r} is not STREAM:GROUP")
    return stream, group


def select(selectors=()):
    """The specs named by ``STREAM:GROUP`` selectors, or all of them when none are given."""
    specs = registered()
    if not specs:
        raise ConsumerConfigError(
            "no consumers are registered. Declare one with @consumer(...) in a consumers.py module "
            "of an installed app."
        )
    if not selectors:
        return specs
    known = ", ".join(spec.name for spec in specs)
    chosen = []
    for selector in selectors:
        key = split_selector(selector)
        if key not in _registry:
            raise ConsumerConfigError(f"no consumer is registered for {selector!r}. Registered: {known}")
        if _registry[key] not in chosen:
            chosen.append(_registry[key])
    return chosen
