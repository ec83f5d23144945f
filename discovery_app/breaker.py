"""Per-instance circuit breakers (failure accrual, as in Finagle; outlier ejection, as in Envoy).

closed --N consecutive failures--> open --cool-down--> half-open: one trial call is let through;
its success closes the breaker, its failure opens it for another cool-down. A trial whose result
never comes back (the caller forgot to report) is given up after one more cool-down.
"""
import threading
import time

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


class _State:
    __slots__ = ("failures", "opened_at", "trial_at")

    def __init__(self):
        self.failures = 0
        self.opened_at = None  # None: closed
        self.trial_at = None  # when the half-open trial was handed out


class Breakers:
    def __init__(self, failures=5, cooldown=30.0, clock=time.monotonic):
        self.threshold = failures
        self.cooldown = cooldown
        self.clock = clock
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()

    def state(self, key, now=None):
        with self._lock:
            return self._state_of(self._states.get(key), self.clock() if now is None else now)

    def _state_of(self, st, now):
        if st is None or st.opened_at is None:
            return CLOSED
        if now - st.opened_at < self.cooldown:
            return OPEN
        if st.trial_at is not None and now - st.trial_at < self.cooldown:
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
                return True
            return False

    def success(self, key):
        with self._lock:
            self._states.pop(key, None)

    def failure(self, key, now=None):
        """Count a failure; returns True when this failure opened (or re-opened) the breaker."""
        now = self.clock() if now is None else now
        with self._lock:
            st = self._states.setdefault(key, _State())
            if st.opened_at is not None:
                if st.trial_at is not None or now - st.opened_at >= self.cooldown:
                    st.opened_at, st.trial_at = now, None  # the trial failed: another cool-down
                    return True
                return False  # a call already in flight when it opened: no news
            st.failures += 1
            if st.failures >= self.threshold:
                st.opened_at = now
                return True
            return False

    def forget(self, keys_to_keep):
        """Drop the state of instances that are no longer registered."""
        with self._lock:
            for key in list(self._states):
                if key not in keys_to_keep:
                    del self._states[key]
