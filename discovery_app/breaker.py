"""Per-instance circuit breakers (failure accrual, as in Finagle; outlier ejection, as in Envoy).

closed --N consecutive failures--> open --cool-down--> half-open: one trial call is let through;
its success closes the breaker, its failure opens it again. A trial whose result never comes back
(the caller forgot to report) is given up after one more cool-down.

Repeat offenders stay out longer, as Envoy's outlier ejection: the k-th ejection in a row (a failed
trial, or opening again within ``memory`` seconds of closing) lasts cooldown x 2^(k-1), capped at
``max_cooldown``, plus up to 10 % random jitter so that clients do not all retry it at once.
"""
import random
import threading
import time

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


class _State:
    __slots__ = ("cooldown", "ejections", "failures", "opened_at", "trial_at")

    def __init__(self, ejections=0):
        self.failures = 0
        self.opened_at = None  # None: closed
        self.trial_at = None  # when the half-open trial was handed out
        self.cooldown = 0.0  # of the current ejection
        self.ejections = ejections  # in a row, this one included


JITTER = 0.1
"""Up to this share of a repeat ejection's time is added at random."""


class Breakers:
    def __init__(self, failures=5, cooldown=30.0, clock=time.monotonic, max_cooldown=None, rng=None):
        self.threshold = failures
        self.cooldown = cooldown
        self.max_cooldown = 10 * cooldown if max_cooldown is None else max_cooldown
        self.memory = self.max_cooldown  # closed this recently, an instance that opens again is a repeat offender
        self.clock = clock
        self.rng = rng or random.Random()
        self._states: dict[str, _State] = {}
        self._closed_at: dict[str, tuple] = {}  # key -> (when it last closed, ejections it had)
        self._lock = threading.Lock()
        self.version = 0  # bumped on every state change: lets a client reuse what it computed from them

    def next_change(self, now=None):
        """The earliest time after ``now`` (this object's clock) at which some breaker changes state
        by itself (a cool-down ends), or +inf."""
        now = self.clock() if now is None else now
        with self._lock:
            ends = [st.opened_at + st.cooldown for st in self._states.values() if st.opened_at is not None]
            ends += [st.trial_at + st.cooldown for st in self._states.values() if st.trial_at is not None]
        return min((end for end in ends if end > now), default=float("inf"))

    def _eject(self, st, key, now):
        self.version += 1
        st.opened_at, st.trial_at = now, None
        st.ejections += 1
        if st.ejections == 1:
            st.cooldown = self.cooldown
        else:
            grown = min(self.max_cooldown, self.cooldown * 2 ** (st.ejections - 1))
            st.cooldown = grown * (1 + self.rng.uniform(0, JITTER))

    def cooldown_of(self, key):
        st = self._states.get(key)
        return self.cooldown if st is None or not st.cooldown else st.cooldown

    def opened_at(self, key):
        st = self._states.get(key)
        return None if st is None else st.opened_at

    def state(self, key, now=None):
        with self._lock:
            return self._state_of(self._states.get(key), self.clock() if now is None else now)

    def _state_of(self, st, now):
        if st is None or st.opened_at is None:
            return CLOSED
        if now - st.opened_at < st.cooldown:
            return OPEN
        if st.trial_at is not None and now - st.trial_at < st.cooldown:
            return OPEN  # the single trial is out; everyone else keeps away
        return HALF_OPEN

    def available(self, key, now=None):
        """May a call go to ``key`` (without claiming the half-open trial)?"""
        if key not in self._states:  # the common case, without the lock (a dict read is atomic)
            return True
        return self.state(key, now) != OPEN

    def acquire(self, key, now=None):
        """Claim the right to call ``key``: always in closed, once per cool-down in half-open."""
        now = self.clock() if now is None else now
        if key not in self._states:
            return True
        with self._lock:
            st = self._states.get(key)
            state = self._state_of(st, now)
            if state == CLOSED:
                return True
            if state == HALF_OPEN:
                st.trial_at = now
                self.version += 1
                return True
            return False

    def success(self, key, started_at=None):
        """A call to ``key`` succeeded. One that started before the breaker opened (``started_at``,
        on this object's clock) is old news and closes nothing; the half-open trial starts after."""
        with self._lock:
            st = self._states.get(key)
            if st is not None and st.opened_at is not None and started_at is not None and started_at < st.opened_at:
                return
            st = self._states.pop(key, None)
            if st is not None:
                self.version += 1
                if st.ejections:
                    self._closed_at[key] = (self.clock(), st.ejections)

    def failure(self, key, now=None):
        """Count a failure; returns True when this failure opened (or re-opened) the breaker."""
        now = self.clock() if now is None else now
        with self._lock:
            st = self._states.get(key)
            if st is None:
                closed_at, ejections = self._closed_at.pop(key, (None, 0))
                recent = closed_at is not None and now - closed_at < self.memory
                st = self._states[key] = _State(ejections if recent else 0)
            if st.opened_at is not None:
                if st.trial_at is not None or now - st.opened_at >= st.cooldown:
                    self._eject(st, key, now)  # the trial failed: a longer cool-down
                    return True
                return False  # a call already in flight when it opened: no news
            st.failures += 1
            if st.failures >= self.threshold:
                self._eject(st, key, now)
                return True
            return False

    def reset_after_fork(self):
        """In a forked child: a lock some other thread of the parent held would stay held for ever."""
        self._lock = threading.Lock()

    def forget(self, keys_to_keep):
        """Drop the state of instances that are no longer registered."""
        with self._lock:
            for key in list(self._states):
                if key not in keys_to_keep:
                    del self._states[key]
                    self.version += 1
            for key in list(self._closed_at):
                if key not in keys_to_keep:
                    del self._closed_at[key]
