"""The fault schedule of the chaos run, and finding the processes to hit.

The schedule is drawn up front from one seeded generator: which faults, when (seconds after the
start of publishing) and which target (a fraction, mapped onto whatever processes exist then).
The same seed gives the same schedule; process timing itself is the machine's. The network phase
follows the process faults, drawn from the same seed: a cut, a delay, a blackhole, one at a time.
"""
import random
from dataclasses import dataclass

from tests.processes import children, cmdline

GROUPS = ("effects", "flaky")


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after publishing starts
    kind: str  # kill_worker | kill_master | hup | restart_redis | cut | delay | blackhole
    group: str  # the supervisor it hits ("" for Redis)
    pick: float  # in [0, 1): which worker, among those alive then; delay: how long (delay_ms)
    pause: float  # kill_master: seconds before the master is restarted; restart_redis, delay, blackhole: seconds

    @property
    def delay_ms(self):
        return int(100 + 300 * self.pick)

    def __str__(self):
        target = f" {self.group}" if self.group else ""
        return f"{self.at:6.1f}s {self.kind}{target} (pick {self.pick:.2f}, pause {self.pause:.1f}s)"


def schedule(seed, duration, *, worker_kills, master_kills, hups, redis_restarts):
    """Faults spread over [2 s, duration], sorted by time. Redis restarts stay clear of the very end."""
    rng = random.Random(seed)
    faults = []

    def add(kind, count, *, late=duration, pause=(0.0, 0.0), group=True):
        for _ in range(count):
            faults.append(Fault(
                at=round(rng.uniform(2.0, late), 1), kind=kind,
                group=rng.choice(GROUPS) if group else "", pick=rng.random(), pause=round(rng.uniform(*pause), 1),
            ))

    add("kill_worker", worker_kills)
    add("kill_master", master_kills, pause=(0.2, 2.0))
    add("hup", hups)
    add("restart_redis", redis_restarts, late=duration * 0.8, pause=(0.0, 2.0), group=False)
    return sorted(faults, key=lambda f: f.at)


def network_phase(seed, start, *, blackhole):
    """The network faults, in order from ``start``: every connection cut at once; each chunk held
    100-400 ms for 4-6 s; then a blackhole of ``blackhole`` seconds or up to 2 s more (connections
    stay open and dead, as after a NAT or load-balancer drop). Each ends before the next begins."""
    rng = random.Random(f"network {seed}")  # its own stream: the process schedule of a seed stays the same
    cut = Fault(at=round(start + rng.uniform(0.5, 1.5), 1), kind="cut", group="", pick=0.0, pause=0.0)
    delay = Fault(at=round(cut.at + rng.uniform(1.5, 2.5), 1), kind="delay", group="", pick=rng.random(),
                  pause=round(rng.uniform(4.0, 6.0), 1))
    hole = Fault(at=round(delay.at + delay.pause + rng.uniform(1.0, 2.0), 1), kind="blackhole", group="",
                 pick=0.0, pause=round(rng.uniform(blackhole, blackhole + 2.0), 1))
    return [cut, delay, hole]


def workers(master_pid):
    """{pid: consumer name or None while booting} of the runconsumer workers of a master."""
    found = {}
    for pid in children(master_pid):
        title = cmdline(pid)
        if "runconsumer worker" in title:
            # setproctitle: "shoal: runconsumer worker consuming <name> [<selectors>]"
            words = title.split()
            found[pid] = words[4] if len(words) > 4 and words[3] in ("consuming", "stopping") else None
        elif "streams_app.supervisor.worker_main" in title:
            found[pid] = None
    return found
