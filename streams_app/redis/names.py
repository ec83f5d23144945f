"""Stream names: what a name must be for Shoal to make its keys (keys.py) and for Redis to store it.

Checked where a name comes in: ``publish``, ``@consumer`` (the registry) and a dead-letter replay.
Below the producer and the registry, which both check names and must not import each other.
"""
from streams_app.exceptions import PublishError

# Names already found valid: a service publishes to a few streams, over and over (bounded all the same).
_valid_names = set()
_MOST_VALID_NAMES = 10_000


def validate_stream_name(stream):
    if type(stream) is str and stream in _valid_names:
        return stream
    if not isinstance(stream, str) or not stream.strip():
        raise PublishError(f"stream name must be a non-empty string, not {stream!r}")
    if "{" in stream or "}" in stream:
        # Shoal wraps the name in {} to pin its keys to one cluster slot; braces inside would break that.
        raise PublishError(f"stream name {stream!r} must not contain '{{' or '}}'")
    utf8_size(stream, "stream name")  # a Redis key is bytes: a lone surrogate has none
    if type(stream) is str:
        if len(_valid_names) >= _MOST_VALID_NAMES:
            _valid_names.clear()
        _valid_names.add(stream)
    return stream


def utf8_size(text, what):
    """Bytes of ``text`` in UTF-8; a lone surrogate (e.g. from "\\ud800" in JSON) cannot be stored."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise PublishError(f"{what} is not valid Unicode: it holds a lone surrogate {text[exc.start]!r} "
                           f"at position {exc.start}, which UTF-8 cannot encode") from None
