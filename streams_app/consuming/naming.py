"""Consumer names: unique per process start, so a restarted worker never inherits a dead one's PEL."""
import os
import secrets
import socket


def consumer_name():
    base = os.environ.get("POD_NAME") or socket.gethostname() or "consumer"
    return f"{base}-{os.getpid()}-{secrets.token_hex(3)}"
