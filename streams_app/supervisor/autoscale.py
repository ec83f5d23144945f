"""Seed 000's autoscaling rule: follow the backlog between a minimum and a maximum worker count."""
import logging

logger = logging.getLogger("streams_app.supervisor")

SCALE_UP_STEP = 2  # workers added at most per decision
SCALE_DOWN_STEP = 1  # removed at most per decision: shrinking slowly avoids flapping on a bursty stream


def decide(lag, current, *, minimum, maximum, target):
    """The worker count for ``lag``: above 2 x target add up to 2, below target / 2 remove 1."""
    current = max(minimum, min(maximum, current))
    if lag > 2 * target:
        return min(current + SCALE_UP_STEP, maximum)
    if lag < target / 2:
        return max(current - SCALE_DOWN_STEP, minimum)
    return current


class Autoscaler:
    """Decides every ``interval`` seconds; ``due(now)`` says when, ``apply()`` decides and logs."""

    def __init__(self, *, minimum, maximum, target, interval):
        if not 1 <= minimum <= maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {minimum} and {maximum}")
        self.minimum = minimum
        self.maximum = maximum
        self.target = target
        self.interval = interval
        self.next_at = 0.0

    def due(self, now):
        return now >= self.next_at

    def apply(self, lag, current, now, estimated=False):
        """Return the new desired count for ``lag`` (an int; never None: unknown lag is not decided on)."""
        self.next_at = now + self.interval
        wanted = decide(lag, current, minimum=self.minimum, maximum=self.maximum, target=self.target)
        if wanted != current:
            logger.info("Supervisor: autoscale: lag %s%s (target %s): workers %d -> %d",
                        lag, " (estimated)" if estimated else "", self.target, current, wanted)
        return wanted
