"""Errors raised by streams_app. Catch ``StreamsError`` to catch them all."""


class StreamsError(Exception):
    """Base class of every error streams_app raises on purpose."""


class PublishError(StreamsError, ValueError):
    """A message could not be published as given (not JSON, too large, bad stream name)."""


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
