"""Consumer names: unique per process start, so a restarted worker never inherits a dead one's PEL."""
import os
import secrets
import socket

from shoal_common.text import safe_text


def consumer_name():
    base = os.environ.get("POD_NAME") or socket.gethostname() or "consumer"
    # The name goes to Redis as UTF-8 and into CLIENT SETNAME, which refuses spaces: os.environ holds
    # bytes that are not UTF-8 as lone surrogates, escaped here (\udcff) like every text Shoal stores.
    base = "-".join(safe_text(base).split()) or "consumer"
    return f"{base}-{os.getpid()}-{secrets.token_hex(3)}"
