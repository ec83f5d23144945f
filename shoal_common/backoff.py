"""The reconnect back-off: how long to wait after failing to reach Redis (or a registry) n times in a row.

One formula for every loop that retries a connection (the consumer's read loop, the broadcast
listener, the discovery listener, client and registrar): doubling from ``first``, capped at ``cap``,
with optional jitter so that processes that lost Redis together do not come back in step.
"""
import random


def backoff_delay(failures, *, first, cap, jitter=0.0, rng=random.random):
    """Seconds to wait after ``failures`` failed attempts in a row: ``first * 2**(failures - 1)``, at most ``cap``.

    ``jitter`` (0..1) scales the delay by a random factor in ``[1 - jitter, 1]``. No failures, no wait.
    """
    if failures <= 0:
        return 0.0
    delay = min(cap, first * 2 ** min(failures - 1, 32))
    return delay * (1.0 - jitter * rng()) if jitter else delay
