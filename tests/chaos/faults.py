"""The fault schedule of the chaos run, and finding the processes to hit.

The schedule is drawn up front from one seeded generator: which faults, when (seconds after the
start of publishing) and which target (a fraction, mapped onto whatever processes exist then).
The same seed gives the same schedule; process timing itself is the machine's.
"""
import random
from dataclasses import dataclass

from tests.processes import children, cmdline

GROUPS = ("effects", "flaky")


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after publishing starts
    kind: str  # kill_worker | kill_master | hup | restart_redis
    group: str  # the supervisor it hits ("" for Redis)
    pick: float  # in [0, 1): which worker, among those alive then
    pause: float  # kill_master: seconds before the master is restarted; restart_redis: seconds down

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
