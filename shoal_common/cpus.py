"""How many CPUs this process may use: the affinity mask and the cgroup CPU quota, not the host's count.

A container limited to 2 CPUs on a 64-core host sees 64 in ``os.cpu_count()``; 64 gunicorn workers
there would be throttled, and use 32 times the memory, for nothing.
"""
import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup_dirs(root, proc_cgroup):
    """Directories that may hold this process's CPU limit: its own cgroup first, then the root."""
    dirs = []
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            dirs.append(root / path.lstrip("/"))
        elif "cpu" in controllers.split(","):  # cgroup v1
            for name in (controllers, "cpu", "cpu,cpuacct"):
                dirs.append(root / name / path.lstrip("/"))
                dirs.append(root / name)
    dirs.append(root)
    return dirs


def cgroup_cpu_limit(root=CGROUP_ROOT, proc_cgroup="/proc/self/cgroup"):
    """The CPU quota as a number of CPUs (may be fractional), or None when there is none."""
    root = Path(root)
    for directory in _own_cgroup_dirs(root, proc_cgroup):
        v2 = directory / "cpu.max"
        if v2.is_file():
            quota, _, period = v2.read_text().strip().partition(" ")
            if quota == "max":
                return None
            return int(quota) / int(period or 100_000)
        v1_quota, v1_period = directory / "cpu.cfs_quota_us", directory / "cpu.cfs_period_us"
        if v1_quota.is_file() and v1_period.is_file():
            quota = int(v1_quota.read_text())
            return None if quota <= 0 else quota / int(v1_period.read_text())
    return None


def available_cpus(root=CGROUP_ROOT, proc_cgroup="/proc/self/cgroup", affinity=None):
    """CPUs this process may run on, capped by the cgroup quota rounded up; at least 1."""
    count = len(os.sched_getaffinity(0)) if affinity is None else affinity
    limit = cgroup_cpu_limit(root, proc_cgroup)
    if limit is not None:
        count = min(count, math.ceil(limit))
    return max(1, count)


def web_concurrency(environ=None, **probe):
    """``WEB_CONCURRENCY`` if set (Heroku's convention), else ``available_cpus()``."""
    environ = os.environ if environ is None else environ
    raw = environ.get("WEB_CONCURRENCY", "").strip()
    if not raw:
        return available_cpus(**probe)
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"WEB_CONCURRENCY={raw!r} is not a positive whole number of gunicorn workers.")
    return value
