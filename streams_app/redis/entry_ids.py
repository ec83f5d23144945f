"""Stream entry ids (``<ms>-<seq>``): checking them and ordering them."""
import re

from shoal_common.text import to_text

ENTRY_ID = re.compile(r"\d{1,20}-\d{1,20}")
MAX_PART = 2**64 - 1  # each part is an unsigned 64-bit integer in Redis; past it Redis answers an error


def is_entry_id(value):
    """A complete entry id, as Redis gives them (both parts, digits only, each below 2^64)."""
    return (isinstance(value, str) and ENTRY_ID.fullmatch(value) is not None
            and all(int(part) <= MAX_PART for part in value.split("-")))


def id_key(entry_id):
    """A sort key: (ms, seq) as integers, since ids do not sort as text ("9-0" < "10-0")."""
    ms, _, seq = to_text(entry_id).partition("-")
    return int(ms), int(seq or 0)


def next_id(entry_id):
    """The smallest stream id after ``entry_id``."""
    ms, seq = id_key(entry_id)
    return f"{ms}-{seq + 1}"
