"""Redis replies as text: redis-py returns bytes or str depending on the client's decode_responses."""


def to_text(value, errors="strict"):
    """``value`` as str: bytes are decoded as UTF-8 (``errors="replace"`` keeps bad bytes visible as U+FFFD)."""
    return value.decode("utf-8", errors) if isinstance(value, bytes) else value


def safe_text(text):
    """``text`` with what UTF-8 cannot hold (lone surrogates, e.g. ``os.fsdecode`` of a name that is not
    UTF-8) written as backslash escapes (``\\udcff``): Redis, PostgreSQL and log files take it as it is."""
    if text.isascii():  # the common case, checked in C: nothing to escape
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def counted(number, singular, plural=None):
    """"1 row", "2 rows": a count with its noun agreeing (``plural`` for irregular nouns)."""
    return f"{number} {singular if number == 1 else plural or singular + 's'}"
