"""The clocks of pending entries: how long a failed entry waits before its next delivery, when an
entry of another consumer may be taken over, and how often a holder keeps its own alive."""

# Held entries are kept alive (their idle time reset) this often, as a fraction of the pending
# timeout, and reads are bounded to what the threads can start within this fraction of it.
KEEP_ALIVE_FRACTION = 4


def backoff_policy(spec, config):
    """(base, cap) seconds for ``spec``: its ``retry_backoff`` over the STREAMS defaults."""
    base, cap = spec.retry_backoff or (None, None)
    base = config["RETRY_BACKOFF"] if base is None else base
    cap = config["RETRY_BACKOFF_MAX"] if cap is None else cap
    return base, max(base, cap)


def backoff_seconds(deliveries, base, cap):
    """Delay after the ``deliveries``-th delivery failed: base, 2*base, 4*base ... capped."""
    exponent = min(max(deliveries, 1) - 1, 32)  # 2**32 * base is past any cap; avoids huge floats
    return min(cap, base * 2**exponent)


def claimable_idle_ms(deliveries, base, cap, pending_timeout_ms):
    """Idle time an entry of another consumer needs before it may be taken over.

    The pending timeout says its consumer is gone; the back-off says its last delivery failed (or
    killed the process) recently enough that retrying now would be a hot loop.
    """
    return max(pending_timeout_ms, int(backoff_seconds(deliveries, base, cap) * 1000))
