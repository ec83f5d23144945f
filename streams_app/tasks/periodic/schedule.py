"""When a periodic task's ticks fall: ``Every(seconds)`` and ``Cron(expression, timezone)``.

Times are whole epoch milliseconds (UTC), so every supervisor of every host names a tick the same way:
the tick is the claim's identity (streams_app/tasks/periodic/scheduler.py) and its result id.

- ``Every(seconds)`` ticks at the multiples of ``seconds`` since the epoch: no start time to agree on.
- ``Cron(expression, timezone)`` ticks at the local wall times a five-field cron expression names in
  ``timezone`` (croniter reads the expression, zoneinfo the zone). Each wall time runs once: a time
  inside a DST gap (02:30 on the spring-forward night) runs at the first instant after the gap, once,
  merged with a tick that falls there; a wall time that the autumn's repeated hour shows twice runs at
  its first occurrence only.

Both take ``ticks(after, until, limit)`` (ascending, ``after < tick <= until``), ``latest(until)``
(the newest tick at or before, or None) and ``next_after(ms)`` (None when it never fires again), and
``describe()`` says the schedule in words.
"""
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

# The wall-time shift of a DST change is under 3 hours in every zone of the tz database.
_MAX_SHIFT = timedelta(hours=3)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Cron candidates looked at before an expression counts as never firing again (croniter itself gives up
# on dates such as 31 February after its own search of years).
_MAX_STEPS = 10_000


def to_ms(moment):
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def to_datetime(ms):
    return _EPOCH + timedelta(milliseconds=ms)


class Every:
    """Every ``seconds`` (a number above 0), at its multiples since the epoch."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.ms = max(1, round(seconds * 1000))

    def ticks(self, after, until, limit):
        first = (after // self.ms + 1) * self.ms
        return list(range(first, until + 1, self.ms))[:limit]

    def latest(self, until):
        return until // self.ms * self.ms

    def next_after(self, ms):
        return (ms // self.ms + 1) * self.ms

    def describe(self):
        value = int(self.seconds) if float(self.seconds).is_integer() else self.seconds
        return f"every {value} second{'' if value == 1 else 's'}"


class Cron:
    """The ticks of a five-field cron ``expression`` in ``timezone`` (a zoneinfo name). Raises ValueError
    for an expression croniter does not read, or one with other than five fields, and ImportError
    when croniter is not installed."""

    def __init__(self, expression, timezone="UTC"):
        from croniter import croniter

        self._croniter = croniter
        if not isinstance(expression, str) or len(expression.split()) != 5:
            raise ValueError(f"a cron expression has five fields (minute hour day month weekday), not {expression!r}")
        if not croniter.is_valid(expression):
            raise ValueError(f"croniter cannot read the cron expression {expression!r}")
        self.expression = expression
        self.timezone = timezone
        self.zone = ZoneInfo(timezone)

    # -- wall time and instants -------------------------------------------------------------

    def _wall(self, ms):
        """The naive local wall time of the instant ``ms``."""
        return to_datetime(ms).astimezone(self.zone).replace(tzinfo=None)

    def _instant(self, wall):
        """The instant (ms) of the naive local ``wall`` time: its first occurrence when the repeated hour
        shows it twice; the end of the gap when a DST gap skips it. Non-decreasing in ``wall``."""
        first = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        if first.astimezone(self.zone).replace(tzinfo=None) == wall:
            return to_ms(first)
        # In a gap, fold 0 reads it with the offset before the change (an instant after the gap) and fold 1
        # with the one after (an instant before it): the first instant whose wall time reaches ``wall`` lies
        # between, at the change itself.
        low = to_ms(wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC))
        high = to_ms(first)
        low, high = min(low, high), max(low, high)
        while high - low > 1000:
            middle = (low + high) // 2
            if self._wall(middle) >= wall:
                high = middle
            else:
                low = middle
        return high // 1000 * 1000

    def _walk(self, start, backwards=False):
        """Candidate wall times from the naive ``start``, one way, at most _MAX_STEPS of them."""
        iterator = self._croniter(self.expression, start)
        step = iterator.get_prev if backwards else iterator.get_next
        for _ in range(_MAX_STEPS):
            try:
                yield step(datetime)
            except Exception:  # CroniterBadDateError and kin: no such date within croniter's search
                return

    # -- the schedule ---------------------------------------------------------------------------

    def next_after(self, ms):
        # Every wall time up to the instant's own maps to an instant at or before it.
        for wall in self._walk(self._wall(ms)):
            instant = self._instant(wall)
            if instant > ms:
                return instant
        return None

    def latest(self, until):
        # From a wall time whose instant is surely later, back to the first candidate at or before ``until``.
        for wall in self._walk(self._wall(until) + _MAX_SHIFT, backwards=True):
            instant = self._instant(wall)
            if instant <= until:
                return instant
        return None

    def ticks(self, after, until, limit):
        found = []
        moment = after
        while len(found) < limit:
            moment = self.next_after(moment)
            if moment is None or moment > until:
                break
            found.append(moment)
        return found

    def describe(self):
        return f"cron {self.expression} ({self.timezone})"


def due(schedule, last, now, catch_up, late_after, limit, since=None):
    """The ticks to enqueue at ``now``, in order, given ``last`` (the newest tick enqueued, None when none
    ever was). A tick up to ``late_after`` ms old is on time and runs; an older one was missed (nothing ran
    then), and ``catch_up`` says what of those runs: "latest" the newest, "all" each (``limit`` per pass,
    the rest on the next ones), "none" nothing. A schedule never enqueued has missed nothing: its ticks
    start after ``since`` (when the scheduler started), or LATE_AFTER ago."""
    on_time_from = now - late_after
    if last is None:
        last = on_time_from if since is None else max(on_time_from, since)
    missed = []
    if last < on_time_from:
        if catch_up == "all":
            missed = schedule.ticks(last, on_time_from, limit)
            if len(missed) == limit:
                return missed  # the rest, and the ticks on time, come on the next pass, still in order
        elif catch_up == "latest":
            newest = schedule.latest(on_time_from)
            if newest is not None and newest > last:
                missed = [newest]
        last = on_time_from
    return missed + schedule.ticks(last, now, limit)
