"""A private Redis Cluster for tests: redis-server --cluster-enabled on free ports, joined by redis-cli.

Each node is a subprocess of the test run (never daemonized), so stopping the cluster kills
exactly the processes the tests started. ``start()`` returns once the cluster says ``ok``, every
slot is served and every replica has finished its first sync (a replica that never synced refuses
to fail over).

``proxied=True`` puts a TCP proxy (tests/netproxy.py) in front of each node and has the node announce
the proxy's port (``cluster-announce-port``; the bus stays direct), so every client that learns the
topology from the cluster, and replication, goes through the proxies: ``proxies[port]`` faults one node.
"""
import os
import shutil
import signal
import subprocess

import redis
from redis.cluster import ClusterNode, RedisCluster

from tests.netproxy import NetProxy
from tests.ports import BUS_PORT_OFFSET, free_cluster_port
from tests.redis_server import REDIS_SERVER
from tests.waiting import wait_for

REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
NODE_TIMEOUT_MS = 2000


class RedisClusterServer:
    def __init__(self, directory, masters=3, replicas=0, proxied=False):
        self.directory = directory
        self.masters = masters
        self.replicas = replicas
        self.proxied = proxied
        self.ports = []
        self.processes = {}
        self.proxies = {}  # node port -> its NetProxy (proxied only)

    # The same surface as tests.redis_server.RedisServer, so a test can take either.
    @property
    def port(self):
        return self.ports[0]

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs):
        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in self.ports],
                            **{"decode_responses": True, "socket_timeout": 10, **kwargs})

    def node(self, port, **kwargs):
        return redis.Redis(port=port, decode_responses=True, socket_timeout=10, **kwargs)

    def flushall(self, client):
        client.flushall(target_nodes=RedisCluster.PRIMARIES)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self):
        count = self.masters * (1 + self.replicas)
        self.ports = []
        for _ in range(count):
            self.ports.append(free_cluster_port(taken=set(self.ports) | {p + BUS_PORT_OFFSET for p in self.ports}))
        if self.proxied:
            # Not on a node's bus port, which is bound only when the node starts.
            taken = set(self.ports) | {p + BUS_PORT_OFFSET for p in self.ports}
            for port in self.ports:
                self.proxies[port] = NetProxy(port, port=free_cluster_port(taken)).start()
                taken.add(self.proxies[port].port)
        for port in self.ports:
            self._start_node(port)
        for port in self.ports:
            wait_for(lambda port=port: self._pings(port), timeout=15, what=f"cluster node on port {port}")
        create = subprocess.run(
            [REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=60,
        )
        if create.returncode:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout}{create.stderr}")
        wait_for(self.healthy, timeout=60, what="the test cluster to reach state ok")
        return self

    def _start_node(self, port):
        directory = os.path.join(self.directory, str(port))
        os.makedirs(directory, exist_ok=True)
        announce = []
        if port in self.proxies:
            announce = ["--cluster-announce-ip", "127.0.0.1", "--cluster-announce-port", str(self.proxies[port].port),
                        "--cluster-announce-bus-port", str(port + BUS_PORT_OFFSET)]
        self.processes[port] = subprocess.Popen(
            [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory,
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--logfile", "redis.log", *announce],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def restart_node(self, port):
        """Start a killed node again on its port and data directory: it rejoins the cluster it knew."""
        self._start_node(port)
        wait_for(lambda: self._pings(port), timeout=15, what=f"cluster node on port {port} again")

    def _pings(self, port):
        if self.processes[port].poll() is not None:
            raise RuntimeError(f"cluster node on port {port} exited with {self.processes[port].returncode}")
        try:
            return self.node(port).ping()
        except (redis.ConnectionError, redis.BusyLoadingError):
            return False

    def healthy(self):
        live = [p for p in self.ports if self.processes[p].poll() is None]
        try:
            info = self.node(live[0]).cluster("info")
            if info.get("cluster_state") != "ok" or int(info.get("cluster_slots_ok", 0)) != 16384:
                return False
            if int(info.get("cluster_known_nodes", 0)) != len(self.ports):
                return False
            for port in live:
                replication = self.node(port).info("replication")
                if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                    return False
            # Every node must agree on the slot map, or a client started now sees a partial one.
            for port in live:
                if self.node(port).cluster("info").get("cluster_state") != "ok":
                    return False
        except redis.RedisError:
            return False
        return True

    def stop(self, sig=signal.SIGKILL):
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(sig)
                process.wait(timeout=10)
        for proxy in self.proxies.values():
            proxy.stop()
