"""Free ports for the servers tests start, one range per pytest-xdist worker.

Under ``pytest -n N`` (``make test``) each worker (gw0, gw1, ...) takes its ports from ranges no other
worker of the run uses, below the kernel's ephemeral range (32768-60999 on Linux): between the moment a
port is chosen and the moment its server binds it, neither another worker's server nor the local end of
some outgoing connection can take it. Within its range a worker starts at a random offset (another
checkout's run on the same host has the same ranges) and checks each port by binding it.

A plain ``pytest`` run (one process) lets the kernel choose, as before.
"""
import os
import random
import socket
import threading

SLOTS = 8  # ranges; worker gwN uses range N % SLOTS
SINGLE = (10000, 1000)  # gw0: 10000-10999, ..., gw7: 17000-17999
CLUSTER = (18000, 400)  # gw0: 18000-18399, ..., gw7: 20800-21199; their bus ports (+10000) below 31200
BUS_PORT_OFFSET = 10000  # a cluster node also listens on port + 10000

_lock = threading.Lock()
_next = {}


def worker_index():
    """This xdist worker's number (gw3 -> 3), or None outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


def _bindable(port):
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False


def _from_range(kind, base, span, index, usable):
    start = base + (index % SLOTS) * span
    with _lock:
        offset = _next.setdefault(kind, random.randrange(span))
        for step in range(span):
            port = start + (offset + step) % span
            if usable(port):
                _next[kind] = (offset + step + 1) % span
                return port
    raise RuntimeError(f"no free port left in {start}-{start + span - 1} (xdist worker {index})")


def free_port():
    """A free port for a server (redis-server, gunicorn, a proxy, a metrics endpoint)."""
    index = worker_index()
    if index is None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    return _from_range("single", *SINGLE, index, _bindable)


def free_cluster_port(taken=()):
    """A port whose cluster bus port (+10000) is free too."""
    def usable(port):
        return (port not in taken and port + BUS_PORT_OFFSET not in taken
                and _bindable(port) and _bindable(port + BUS_PORT_OFFSET))

    index = worker_index()
    if index is not None:
        return _from_range("cluster", *CLUSTER, index, usable)
    for _ in range(1000):
        port = random.randint(20000, 45000)  # an OS-chosen free port may be above 55535
        if usable(port):
            return port
    raise RuntimeError("no free port pair for a cluster node")
