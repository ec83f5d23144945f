"""What running a chunk of messages produced: named types for the failure path.

No imports from the rest of streams_app: the metrics and the dead-letter code read these too.
"""
import enum
from dataclasses import dataclass, field

from shoal_common.text import safe_text


class Status(enum.Enum):
    FAILED = "error"  # the handler raised (or could not run): retried, dead-lettered at max_deliveries
    POISON = "poison"  # the payload cannot be decoded: dead-lettered at once, no retry can help
    REJECTED = "rejected"  # the handler raised RejectMessage: dead-lettered at once, with its reason

    @property
    def reason(self):
        """The ``reason`` label of ``shoal_messages_failed_total``."""
        return self.value


@dataclass(slots=True)
class Outcome:
    """One message that did not succeed, and why."""

    message: object
    status: Status
    error: BaseException | None = None


@dataclass(slots=True)
class ChunkResult:
    """What ``run_chunk`` hands back to the read loop.

    ``acked``: entry ids to acknowledge (handled, duplicates, replays meant for another group).
    ``failed``: an Outcome per message that failed. ``seconds_per_message``: handler time of the
    chunk over the messages it started (sizes the next chunks). ``left``: messages never started
    because the chunk ran out of its time budget; still pending, the loop hands them out again.
    ``unrun``: messages never started that stay pending for a later delivery (ordered mode: those
    behind a failed one, or after the lease was lost); the loop takes back their delivery count.
    ``ended``: see below.
    """

    acked: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    seconds_per_message: float = 0.0
    left: list = field(default_factory=list)
    unrun: list = field(default_factory=list)
    # The run ledger's field of a chunk the read loop recorded (runs.RecordedAhead): the loop deletes it
    # in the round trip of this chunk's acks.
    ended: object = None


def dead_lettered(outcome, max_deliveries):
    """True when ``outcome`` goes to the dead-letter stream now: poison input, a RejectMessage, or its
    last delivery failed. Otherwise it is retried after its back-off (streams_app.consuming.retry). The read loop and
    the in-process runner of streams_app.testing both decide by this."""
    return (outcome.status in (Status.POISON, Status.REJECTED)
            or outcome.message.deliveries >= max_deliveries)


def exception_text(exc):
    """``Type: message`` of an exception; never raises, even when the exception's ``__str__`` does.

    Exceptions that format their attributes in ``__str__`` can fail there; describing a handler's
    failure must not become a second failure in the read loop. Falls back to ``repr``, then to the
    type name alone. Text UTF-8 cannot hold (a lone surrogate) is escaped (safe_text): the description
    goes to Redis and to logs.
    """
    name = type(exc).__name__
    try:
        return safe_text(f"{name}: {exc}")
    except BaseException:  # noqa: BLE001 -- whatever __str__ raises, the description must not
        pass
    try:
        return safe_text(f"{name} (str() failed): {exc!r}")
    except BaseException:  # noqa: BLE001
        return f"{name} (str() and repr() failed)"
