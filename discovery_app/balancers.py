"""Load-balancing strategies: pick one instance from a non-empty list of candidates.

``inflight`` is a mapping instance key -> calls in flight through this client (see
DiscoveryClient.track). Every strategy is safe to call from many threads at once.

Every strategy honours weights: at equal load each instance gets its weight's share of the picks,
and load is judged per unit of weight (calls in flight / weight, as Envoy's weighted least-request).
Weight 0 means draining: DiscoveryClient.resolve never offers such an instance while another has a
positive weight; if all are 0 they count as equal (better a drained instance than none).
"""
import bisect
import heapq
import itertools
import random
import threading


def key_of(instance):
    return instance.instance_id


_profiles: dict = {}  # id(list) -> (the list, uniform?, cumulative weights); see _profile
_PROFILES_KEPT = 64


def _profile(instances):
    """(every weight equal?, cumulative weights) of a candidate list, computed once per list: the
    client hands the same list to every pick until something changes, and an O(n) pass per pick
    would cost milliseconds at 10,000 instances. Holding the list keeps its id from being reused."""
    found = _profiles.get(id(instances))
    if found is not None and found[0] is instances:
        return found[1], found[2]
    weights = _weights(instances)
    uniform = len(set(weights)) <= 1
    cumulative = list(itertools.accumulate(weights))
    if len(_profiles) >= _PROFILES_KEPT:
        _profiles.clear()
    _profiles[id(instances)] = (instances, uniform, cumulative)
    return uniform, cumulative


def _draw(rng, instances, cumulative):
    """One instance at random by weight, in O(log n)."""
    return instances[bisect.bisect_right(cumulative, rng.random() * cumulative[-1])]


def _weights(instances):
    weights = [instance.weight for instance in instances]
    return weights if any(weights) else [1.0] * len(instances)


def _load(instance, inflight):
    return inflight.get(key_of(instance), 0) / (instance.weight or 1.0)


class _Schedule:
    """Earliest deadline first over one candidate list (Envoy's weighted round-robin): an instance of
    weight w is due every 1/w, and each pick takes whichever is due first, from a heap: O(log n) a pick
    where a pass over every weight (nginx's smooth WRR) was O(n). A new instance starts half a period
    in, which spreads each one's picks evenly (1:3 gives b a b b). Deadlines carry over to the next
    list, so a list rebuilt when a breaker or a health state changes does not start anyone afresh."""

    __slots__ = ("instances", "steps", "heap", "now")

    def __init__(self, instances, weights, previous=None):
        self.instances = instances
        # Weight 0 (draining, offered only among others that are too) is never due while any other is.
        self.steps = [1.0 / w if w > 0 else float("inf") for w in weights]
        due, self.now = (previous.deadlines(), previous.now) if previous is not None else ({}, 0.0)
        self.heap = [(due.get(key_of(instance), self.now + step / 2), index)
                     for index, (instance, step) in enumerate(zip(instances, self.steps))]
        heapq.heapify(self.heap)

    def deadlines(self):
        return {key_of(self.instances[index]): deadline for deadline, index in self.heap}

    def pick(self):
        deadline, index = self.heap[0]
        heapq.heapreplace(self.heap, (deadline + self.steps[index], index))
        self.now = deadline
        return self.instances[index]


class RoundRobin:
    """Exact rotation; with unequal weights, earliest-deadline-first (``_Schedule``): each instance gets
    its weight's share of every round, its picks spread evenly (1:3 gives b a b b)."""

    name = "round-robin"

    def __init__(self, rng=None):
        self._counters: dict[str, itertools.count] = {}
        self._schedules: dict[str, _Schedule] = {}  # service -> the schedule of its current candidate list
        self._lock = threading.Lock()

    def pick(self, service, instances, inflight):
        if not _profile(instances)[0]:
            return self._weighted(service, instances)
        counter = self._counters.get(service)
        if counter is None:
            with self._lock:
                counter = self._counters.setdefault(service, itertools.count())
        # next() on itertools.count is atomic under the GIL: exact rotation across threads.
        return instances[next(counter) % len(instances)]

    def _weighted(self, service, instances):
        with self._lock:
            schedule = self._schedules.get(service)
            if schedule is None or schedule.instances is not instances:
                # The client hands the same list to every pick until something changes: O(n) once per list.
                schedule = self._schedules[service] = _Schedule(instances, _weights(instances), schedule)
            return schedule.pick()


class Random:
    name = "random"

    def __init__(self, rng=None):
        self.rng = rng or random.Random()

    def pick(self, service, instances, inflight):
        uniform, cumulative = _profile(instances)
        if not uniform:
            return _draw(self.rng, instances, cumulative)
        return self.rng.choice(instances)


class WeightedRandom:
    name = "weighted-random"

    def __init__(self, rng=None):
        self.rng = rng or random.Random()

    def pick(self, service, instances, inflight):
        # Every weight 0 (drained, but better than nothing) counts as equal weights.
        return _draw(self.rng, instances, _profile(instances)[1])


class LeastConnections:
    name = "least-connections"

    def __init__(self, rng=None):
        self.rng = rng or random.Random()

    _IDLE_DRAWS = 16

    def pick(self, service, instances, inflight):
        cumulative = _profile(instances)[1]
        if not inflight:  # nothing in flight: every instance ties
            return _draw(self.rng, instances, cumulative)
        if len(inflight) < len(instances):
            # Fewer instances busy than candidates: some candidate is idle, so the least load is 0 and
            # the idle ones tie. A client's calls in flight are few (its threads), so drawing by weight
            # until an idle one comes up takes about n / (n - busy) draws instead of an O(n) pass per
            # pick (14 ms at 10,000 instances). Past a few misses, fall back to the full pass.
            for _ in range(self._IDLE_DRAWS):
                instance = _draw(self.rng, instances, cumulative)
                if not inflight.get(key_of(instance)):
                    return instance
        loads = [inflight.get(key_of(i), 0) / (i.weight or 1.0) for i in instances]
        least = min(loads)
        # Ties are broken at random (by weight), or every caller would pile onto the first idle instance.
        tied = [i for i, load in zip(instances, loads) if load == least]
        return self.rng.choices(tied, weights=_weights(tied))[0]


class PowerOfTwoChoices:
    """Two distinct instances drawn at random by weight; the one with fewer calls in flight per unit
    of weight wins (a tie goes to the first drawn, so at equal load picks follow the weights)."""

    name = "power-of-two-choices"

    def __init__(self, rng=None):
        self.rng = rng or random.Random()

    def pick(self, service, instances, inflight):
        if len(instances) == 1:
            return instances[0]
        uniform, cumulative = _profile(instances)
        if uniform:
            # Two distinct indices in O(1) (random.sample is several times slower on this path).
            n, draw = len(instances), self.rng.random
            first, second = int(draw() * n), int(draw() * (n - 1))
            a, b = instances[first], instances[second + (second >= first)]
            load_a, load_b = inflight.get(a.instance_id, 0), inflight.get(b.instance_id, 0)
            return b if load_b < load_a else a  # a tie goes to a, drawn at random
        else:
            a = _draw(self.rng, instances, cumulative)
            b = a
            for _ in range(8):  # a second, different one; heavy skew may take a few draws
                b = _draw(self.rng, instances, cumulative)
                if b is not a:
                    break
            if b is a:
                b = self.rng.choice([i for i in instances if i is not a])
        load_a, load_b = _load(a, inflight), _load(b, inflight)
        if load_a == load_b:
            return a  # drawn first, and at random
        return a if load_a < load_b else b


STRATEGIES = {cls.name: cls for cls in (RoundRobin, Random, WeightedRandom, LeastConnections, PowerOfTwoChoices)}


def make_strategy(strategy, rng=None):
    """A strategy object from its name, or the object itself."""
    if isinstance(strategy, str):
        try:
            return STRATEGIES[strategy](rng=rng)
        except KeyError:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}") from None
    if not hasattr(strategy, "pick"):
        raise ValueError(f"strategy must be a name or an object with pick(), not {strategy!r}")
    return strategy
