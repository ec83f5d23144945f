"""Errors raised by streams_app. Catch ``StreamsError`` to catch them all."""
from __future__ import annotations


class StreamsError(Exception):
    """Base class of every error streams_app raises on purpose."""


class PublishError(StreamsError, ValueError):
    """A message could not be published as given (not JSON, too large, bad stream name).

    From ``publish_many`` (and an outbox publish of several), ``index`` is the refused message's
    position and ``reason`` the refusal without it; both are None otherwise.
    """

    index: int | None = None
    reason: str | None = None


class PartialPublishError(PublishError):
    """``publish_many`` stopped part-way: Redis failed after some batches were stored.

    ``ids``: the entry ids stored for sure, one per message from the first (messages ``0..len(ids)-1``).
    ``in_doubt``: how many messages after those may or may not have been stored (the connection
    broke while their batch was sent); the rest were not published. ``cause``: the Redis error.
    """

    def __init__(self, message: str, *, ids: list[str], in_doubt: int, cause: BaseException) -> None:
        super().__init__(message)
        self.ids = ids
        self.in_doubt = in_doubt
        self.cause = cause


class NotReplicatedError(PublishError):
    """``publish(..., replicas=n)``: the entry is stored on the master, but fewer than ``n`` replicas
    confirmed it in time, so a failover right now could lose it. ``id`` is the stored entry's id.

    From ``publish_many(..., replicas=n)``: every message is stored (``ids``, in order; ``id`` is None)
    and ``unconfirmed`` lists the indexes of those whose master had fewer than ``n`` replicas confirm;
    ``replicas`` is the fewest any of their masters confirmed."""

    def __init__(self, message: str, *, id: str | None, replicas: int, ids: list[str | None] | None = None,
                 unconfirmed: list[int] | None = None) -> None:
        super().__init__(message)
        self.id = id
        self.replicas = replicas
        self.ids = ids
        self.unconfirmed = unconfirmed


class StreamTypeError(StreamsError):
    """A key that should be a stream holds another type; Shoal leaves such a key alone."""


class ConsumerConfigError(StreamsError):
    """A ``@consumer`` declaration or a runconsumer selection is invalid."""


class PayloadDecodeError(StreamsError):
    """An entry's payload is not valid JSON (poison input)."""


class ReplayError(StreamsError, ValueError):
    """A replay of dead letters was asked for in a way that cannot be done."""


class BroadcastError(StreamsError, ValueError):
    """A broadcast could not be sent as given (empty type, data that is not JSON)."""


class HandlerShapeError(StreamsError, TypeError):
    """A handler's call did not run its work (it returned a coroutine or a generator): the entry fails."""


class PartitionConfigError(StreamsError):
    """STREAMS["PARTITIONS"] declares another layout than the one a stream's entries are in."""


class HandlerCancelledError(StreamsError):
    """An async handler's task was cancelled by the handler (or a library it called), not by Shoal: the entry fails."""


class RejectMessage(StreamsError):
    """Raised by a handler for a message that no retry can help (it names code that must not run, its
    payload is not what the handler takes): the entry is dead-lettered at once with this exception's
    text as the reason, without the retries max_deliveries would give an ordinary failure."""
