"""Load-balancing strategies: pick one instance from a non-empty list of candidates.

``inflight`` is a mapping instance key -> calls in flight through this client (see
DiscoveryClient.track). Every strategy is safe to call from many threads at once.
"""
import itertools
import random
import threading


def key_of(instance):
    return instance.instance_id


class RoundRobin:
    name = "round-robin"

    def __init__(self, rng=None):
        self._counters: dict[str, itertools.count] = {}
        self._lock = threading.Lock()

    def pick(self, service, instances, inflight):
        counter = self._counters.get(service)
        if counter is None:
            with self._lock:
                counter = self._counters.setdefault(service, itertools.count())
        # next() on itertools.count is atomic under the GIL: exact rotation across threads.
        return instances[next(counter) % len(instances)]


class Random:
    name = "random"

    def __init__(self, rng=None):
        self.rng = rng or random.Random()

    def pick(self, service, instances, inflight):
        return self.rng.choice(instances)


class WeightedRandom:
    name = "weighted-random"

    def __init__(self, rng=None):
        self.rng = rng or random.Random()

    def pick(self, service, instances, inflight):
        weights = [instance.weight for instance in instances]
        if not any(weights):
            return self.rng.choice(instances)  # every weight 0: drained, but better than nothing
        return self.rng.choices(instances, weights=weights)[0]


class LeastConnections:
    name = "least-connections"

    def __init__(self, rng=None):
        self.rng = rng or random.Random()

    def pick(self, service, instances, inflight):
        least = min(inflight.get(key_of(i), 0) for i in instances)
        # Ties are broken at random, or every caller would pile onto the first idle instance.
        return self.rng.choice([i for i in instances if inflight.get(key_of(i), 0) == least])


class PowerOfTwoChoices:
    """Two distinct instances at random; the one with fewer calls in flight wins."""

    name = "power-of-two-choices"

    def __init__(self, rng=None):
        self.rng = rng or random.Random()

    def pick(self, service, instances, inflight):
        if len(instances) == 1:
            return instances[0]
        a, b = self.rng.sample(instances, 2)
        load_a, load_b = inflight.get(key_of(a), 0), inflight.get(key_of(b), 0)
        if load_a == load_b:
            return a  # sample() already made the order random
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
