"""The chaos run: publish N keyed messages through faults, then count that nothing was lost.

All real processes on a private, persistent redis-server: a producer thread (this process) XADDs
at a steady rate to ``chaos``, read by two groups, each under its own ``runconsumer --min-workers 1
--max-workers 4`` supervisor, with one ``runreclaimer`` throughout:

- ``effects`` (idempotent="db") inserts one Effect row per message key (tests/testapp/consumers.py);
- ``flaky`` fails, every time, on a deterministic 1% of keys (crc32), which must end in ``{chaos}:dlq``
  after max_deliveries, and nowhere else; it counts the others in a Redis hash.

Faults come from a schedule drawn from one seed (printed; ``SHOAL_CHAOS_SEED=<seed>`` replays it):
SIGKILL of workers, SIGKILL of a supervisor master (its workers see they are orphaned and stop; the
master is started again), SIGHUP rolling restarts, one restart of redis-server. Then, once the
effects group has caught up, the network phase, publishing NETWORK_RATE a second all along: Shoal's
processes reach Redis through a TCP proxy (tests/netproxy.py; the producer and the checks do not),
which cuts every connection, delays every chunk for a few seconds, then blackholes every connection
for longer than both the pool's socket timeout (5 s) and a reader's (BLOCK_MS + 5 s); after the
heal, every key published before it must have its effect within DRAIN_DEADLINE (the recovery bound
of docs/consuming.md plus the time to work off the backlog). Then SIGTERM of everything, and the
checks, by counting.

    nice -n 10 .venv/bin/pytest -s tests/chaos/test_chaos.py  # prints the recovery after the blackhole

Redis restarts with SIGTERM: a clean shutdown fsyncs the AOF, so Redis keeps every write it
acknowledged and the counts can be strict. Killed with SIGKILL under ``appendfsync everysec``,
Redis may lose up to about a second of acknowledged writes: XADDs (messages the producer was told
were stored), XACKs (redelivered: harmless) and dead-letter moves or handler writes (then the
counts below could not tell Shoal's losses from Redis's). The producer retries a batch cut short
by the restart, so a key may be in the stream twice (two entries): the checks count entries that
Redis holds, and the db guard, keyed by message key, must still give one row per key.

``SHOAL_CHAOS_LONG=1`` runs 100,000 messages and more faults (several minutes).
"""
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
import redis as redis_py

from project.env import env_bool
from streams_app.publishing.encoding import encode_message
from tests.chaos import faults
from tests.conftest import ROOT, ConsumerProcess
from tests.netproxy import NetProxy
from tests.testapp.consumers import CHAOS_STREAM, chaos_fails
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

LONG = env_bool("SHOAL_CHAOS_LONG", False)
MESSAGES = 100_000 if LONG else 20_000
PUBLISH_SECONDS = 200 if LONG else 40
NETWORK_RATE = 100  # messages a second published through the network phase
BLACKHOLE = 10  # seconds at least: above the pool's SOCKET_TIMEOUT (5 s) and a reader's, BLOCK_MS + 5 s
DRAIN_DEADLINE = 40  # seconds after the heal: docs/consuming.md's 12 s bound, then the backlog worked off
FAULTS = (dict(worker_kills=24, master_kills=4, hups=6, redis_restarts=3) if LONG
          else dict(worker_kills=6, master_kills=1, hups=2, redis_restarts=1))
SETTLE_SECONDS = 300 if LONG else 90  # after the last publish, for every entry to be handled or dead-lettered
BATCH = 50  # entries per producer pipeline

STREAMS = {
    "PENDING_TIMEOUT_MS": 3000,  # a killed worker's entries are taken over after 3 s
    "CLAIM_INTERVAL_MS": 500,
    "BLOCK_MS": 1000,  # a live consumer touches the group every second: never "idle" to the reclaimer
    "DEAD_CONSUMER_IDLE": 6,  # killed workers' names are removed 6 s after their entries are taken over
    "RESTART_DELAY": 0.2,
    "CRASH_LIMIT": 100,  # the kills here are the test's, not a crash loop
    "SHUTDOWN_TIMEOUT": 10,
    "SNAPSHOT_INTERVAL": 5,
}
DLQ = f"{{{CHAOS_STREAM}}}:dlq"
HANDLED = "chaos:flaky:handled"


@pytest.fixture
def seed():
    value = int(os.environ.get("SHOAL_CHAOS_SEED") or random.SystemRandom().randrange(1, 2**31))
    print(f"chaos seed {value}: rerun with SHOAL_CHAOS_SEED={value}", flush=True)
    return value


@pytest.fixture
def database(tmp_path):
    """A migrated SQLite file in WAL mode: readers (the checks, the admin mirror) never block writers."""
    path = tmp_path / "chaos.sqlite3"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": f"sqlite:///{path}"}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    return path


class Cluster:
    """The processes of the run, and the faults applied to them."""

    def __init__(self, server, proxy, database):
        self.server = server
        self.proxy = proxy
        self.producer = None
        self.healed = None  # (monotonic time, keys published) when the blackhole ended
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "REDIS_URL": proxy.url,
            "DATABASE_URL": f"sqlite:///{database}",
            "SHOAL_TEST_STREAMS": json.dumps(STREAMS),
            "PYTHONUNBUFFERED": "1",
        }
        self.masters = {}  # group -> its current supervisor
        self.killed_masters = []
        self.reclaimer = None
        self.done = Counter()  # fault kind -> times it hit something
        self.log = []

    def start_master(self, group):
        self.masters[group] = ConsumerProcess([
            f"{CHAOS_STREAM}:{group}", "--min-workers", "1", "--max-workers", "4", "--threads", "4",
            "--target-lag", "200", "--scale-interval", "2", "--heartbeat-interval", "0.5",
            "--heartbeat-timeout", "20", "-v", "1",
        ], self.env)

    def start(self):
        for group in faults.GROUPS:
            self.start_master(group)
        self.reclaimer = ConsumerProcess(["--interval", "0.5", "-v", "1"], self.env, command="runreclaimer")
        for master in self.masters.values():
            master.wait_for_output("is consuming", timeout=60)
        self.reclaimer.wait_for_output("Reclaimer: watching", timeout=60)

    def apply(self, fault):
        outcome = getattr(self, fault.kind)(fault)
        self.log.append(f"{fault} -> {outcome}")
        if not outcome.startswith("nothing"):
            self.done[fault.kind] += 1

    def kill_worker(self, fault):
        master = self.masters[fault.group]
        consuming = sorted(pid for pid, name in faults.workers(master.pid).items() if name)
        if not consuming:
            return "nothing to kill (no worker consuming)"
        pid = consuming[int(fault.pick * len(consuming))]
        os.kill(pid, signal.SIGKILL)
        return f"killed worker {pid} of {len(consuming)}"

    def kill_master(self, fault):
        master = self.masters[fault.group]
        master.kill()
        self.killed_masters.append(master)
        time.sleep(fault.pause)  # the outage itself: the orphaned workers stop while no master runs
        self.start_master(fault.group)
        # Until its handlers are installed, a SIGHUP (the next fault, maybe) would kill the new master
        # (the default action), as it would any process; systemd and Kubernetes wait for start-up too.
        self.masters[fault.group].wait_for_output("Supervisor: started", timeout=60)
        return f"killed master {master.pid}, started {self.masters[fault.group].pid}"

    def hup(self, fault):
        self.masters[fault.group].signal(signal.SIGHUP)
        return "rolling restart"

    def restart_redis(self, fault):
        self.server.stop(signal.SIGTERM)  # a clean shutdown: the AOF is fsynced (see the docstring)
        time.sleep(fault.pause)  # the outage itself
        self.server.start()
        return f"redis-server down {fault.pause}s"

    def cut(self, fault):
        links = self.proxy.links
        self.proxy.cut()
        return f"cut {links} connections"

    def delay(self, fault):
        self.proxy.delay(fault.delay_ms)
        time.sleep(fault.pause)  # the fault itself
        self.proxy.heal()
        return f"held every chunk {fault.delay_ms} ms for {fault.pause}s"

    def blackhole(self, fault):
        links = self.proxy.links
        self.proxy.blackhole()
        time.sleep(fault.pause)  # the fault itself
        self.proxy.heal()
        self.healed = (time.monotonic(), len(self.producer.published))
        return f"blackholed {links} connections (and every new one) for {fault.pause}s"

    def check_masters(self):
        """A master that exited mid-run fails the run at once, with its output, not after the settle timeout."""
        for group, master in self.masters.items():
            if master.proc.poll() is not None:
                raise AssertionError(f"the {group} supervisor exited with {master.proc.returncode} mid-run:\n"
                                     f"{master.output()[-4000:]}")

    def live_consumer_names(self):
        return {name for master in self.masters.values() for name in faults.workers(master.pid).values() if name}

    def stop(self):
        for master in self.masters.values():
            master.signal(signal.SIGTERM)
        return {group: master.wait(60) for group, master in self.masters.items()}

    def kill_all(self):
        """Teardown after a failure: nothing of the run may outlive the test."""
        for master in self.masters.values():
            for pid in faults.workers(master.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in [*self.masters.values(), self.reclaimer]:
            if proc is not None and proc.proc.poll() is None:
                proc.kill()

    def outputs(self, tail=4000):
        procs = [*self.killed_masters, *self.masters.values(), self.reclaimer]
        return "\n".join(f"--- {' '.join(p.args)} (pid {p.pid})\n{p.output()[-tail if tail else 0:]}" for p in procs if p)


class Producer(threading.Thread):
    """XADDs keyed messages in pipelined batches at a steady rate, retrying batches Redis did not take:
    ``keys`` over ``seconds``, then more keys (``m000000``... sorting after them) at ``then_rate`` a
    second until ``stop`` is set."""

    def __init__(self, server, keys, seconds, then_rate):
        super().__init__(daemon=True)
        self.client = server.client()
        self.keys = keys
        self.seconds = seconds
        self.then_rate = then_rate
        self.stop = threading.Event()
        self.retried_batches = 0
        self.published = []  # the keys stored, in order (keys sort in the order they are published)
        self.error = None

    def run(self):
        try:
            start = time.monotonic()
            for first in range(0, len(self.keys), BATCH):
                due = start + self.seconds * first / len(self.keys)
                time.sleep(max(0.0, due - time.monotonic()))  # pacing: the steady rate itself
                self.publish(self.keys[first : first + BATCH])
            batch = max(1, self.then_rate // 10)
            start, first = time.monotonic(), 0
            while not self.stop.wait(max(0.0, start + first / self.then_rate - time.monotonic())):
                self.publish([f"m{n:06d}" for n in range(first, first + batch)])
                first += batch
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def publish(self, keys):
        n = len(self.published)
        batch = [encode_message({"n": n + i}, key=k) for i, k in enumerate(keys)]
        while True:
            try:
                pipe = self.client.pipeline(transaction=False)
                for fields in batch:
                    pipe.xadd(CHAOS_STREAM, fields)
                pipe.execute()
                self.published.extend(keys)
                return
            except (redis_py.ConnectionError, redis_py.TimeoutError, redis_py.BusyLoadingError):
                # Some of the batch may be stored already: publishing again may store a key twice.
                self.retried_batches += 1
                time.sleep(0.1)


def effect_counts(database):
    with sqlite3.connect(database, timeout=30) as db:
        return Counter(dict(db.execute("SELECT name, COUNT(*) FROM testapp_effect GROUP BY name").fetchall()))


def effects_of(database, published):
    """How many of the keys ``published`` (each once, in the order they sort) have their effect."""
    with sqlite3.connect(database, timeout=30) as db:
        return db.execute("SELECT COUNT(DISTINCT name) FROM testapp_effect WHERE name <= ?", (published[-1],)).fetchone()[0]


def wait_for_effects(cluster, database, published, *, since, timeout, what):
    """Until every key of ``published`` has its effect; how long that took after ``since``."""
    try:
        wait_for(lambda: cluster.check_masters() or effects_of(database, published) == len(published),
                 timeout=timeout - (time.monotonic() - since), interval=0.2, what=what)
    except AssertionError:
        print(f"{effects_of(database, published)} of {len(published)} handled", flush=True)
        raise
    return time.monotonic() - since


def dead_letters(client):
    return [fields for _, fields in client.xrange(DLQ)]


@pytest.mark.timeout(PUBLISH_SECONDS + 2 * SETTLE_SECONDS + 240)
def test_nothing_is_lost_under_fire(redis_factory, database, seed):
    server = redis_factory(persistent=True)
    client = server.client()
    keys = [f"k{n:06d}" for n in range(MESSAGES)]
    plan = faults.schedule(seed, PUBLISH_SECONDS, **FAULTS)
    network = faults.network_phase(seed, 0.0, blackhole=BLACKHOLE)
    print("fault schedule:\n  " + "\n  ".join(map(str, plan)), flush=True)
    print("then, once the effects group caught up:\n  " + "\n  ".join(map(str, network)), flush=True)
    proxy = NetProxy(server.port).start()
    cluster = Cluster(server, proxy, database)
    try:
        cluster.start()
        producer = cluster.producer = Producer(server, keys, PUBLISH_SECONDS, then_rate=NETWORK_RATE)
        producer.start()
        start = time.monotonic()
        for fault in plan:
            time.sleep(max(0.0, start + fault.at - time.monotonic()))  # the schedule's own clock
            cluster.apply(fault)

        # The network phase starts from a caught-up group (publishing goes on), so that what it
        # measures is the recovery from its own faults, not the backlog the process faults left.
        wait_for(lambda: len(producer.published) >= len(keys) or producer.error, timeout=PUBLISH_SECONDS + 60,
                 what="the first keys published")
        caught_up = wait_for_effects(cluster, database, producer.published[:len(keys)], since=time.monotonic(),
                                     timeout=SETTLE_SECONDS, what=f"the effects group caught up (seed {seed})")
        start = time.monotonic()
        for fault in network:
            time.sleep(max(0.0, start + fault.at - time.monotonic()))
            cluster.apply(fault)
        healed, mark = cluster.healed
        drained = wait_for_effects(
            cluster, database, producer.published[:mark], since=healed, timeout=DRAIN_DEADLINE,
            what=f"the {mark} keys published before the heal handled within {DRAIN_DEADLINE} s of it (seed {seed})")
        print(f"chaos seed {seed}: the effects group caught up {caught_up:.1f} s after the process faults; the "
              f"keys published before the end of the blackhole were handled {drained:.1f} s after it", flush=True)
        # Each connection that died in the blackhole and was used again would have cost a full socket timeout.
        assert proxy.stale_sends == 0, f"seed {seed}: blackholed connections used after the heal: {proxy.stale_samples[:5]}"
        producer.stop.set()
        producer.join(60)
        assert not producer.is_alive() and producer.error is None, f"seed {seed}: producer: {producer.error!r}"
        keys = producer.published
        print("faults applied:\n  " + "\n  ".join(cluster.log), flush=True)

        # What Redis holds is what the checks count: a batch retried after the restart may hold a key twice.
        entries = {entry_id: fields["key"] for entry_id, fields in client.xrange(CHAOS_STREAM)}
        by_key = Counter(entries.values())
        assert set(by_key) == set(keys), f"seed {seed}: {len(set(keys) - set(by_key))} published keys not in the stream"
        failing = {entry_id for entry_id, key in entries.items() if chaos_fails(key)}
        passing_keys = {key for key in by_key if not chaos_fails(key)}

        def settled():
            cluster.check_masters()
            flaky_dead = [f for f in dead_letters(client) if f["shoal:group"] == "flaky"]
            return (len(effect_counts(database)) == len(by_key) and client.hlen(HANDLED) == len(passing_keys)
                    and len(flaky_dead) >= len(failing)
                    and all(g["pending"] == 0 and g["lag"] == 0 for g in client.xinfo_groups(CHAOS_STREAM)))

        wait_for(settled, timeout=SETTLE_SECONDS, interval=0.5,
                 what=f"every entry handled or dead-lettered, nothing pending (seed {seed})")

        live = cluster.live_consumer_names()
        exits = cluster.stop()
        assert exits == {"effects": 0, "flaky": 0}, f"seed {seed}: supervisors exited {exits}\n{cluster.outputs()}"
        for group in faults.GROUPS:
            stayed = live & {c["name"] for c in client.xinfo_consumers(CHAOS_STREAM, group)}
            assert not stayed, f"seed {seed}: workers stopped by SIGTERM left their names in {group}: {stayed}"
        # The names of SIGKILLed workers: the reclaimer removes them once idle past DEAD_CONSUMER_IDLE.
        wait_for(lambda: not any(client.xinfo_consumers(CHAOS_STREAM, g) for g in faults.GROUPS),
                 timeout=STREAMS["DEAD_CONSUMER_IDLE"] + 20, interval=0.5,
                 what=f"no consumer left registered (seed {seed})")
        cluster.reclaimer.signal(signal.SIGTERM)
        assert cluster.reclaimer.wait(60) == 0, cluster.reclaimer.output()

        # effects: exactly one row per key, written by an entry carrying that key.
        rows = effect_counts(database)
        assert set(rows) == set(by_key), f"seed {seed}: keys without an effect: {sorted(set(by_key) - set(rows))[:10]}"
        twice = {key: n for key, n in rows.items() if n != 1}
        assert not twice, f"seed {seed}: effects not exactly once: {dict(list(twice.items())[:10])}"
        with sqlite3.connect(database) as db:
            mismatched = [(name, entry) for name, entry in db.execute("SELECT name, entry_id FROM testapp_effect")
                          if entries.get(entry) != name]
            guards = db.execute("SELECT COUNT(*), COUNT(DISTINCT key) FROM streams_app_processedmessage "
                                "WHERE stream = ? AND \"group\" = 'effects'", (CHAOS_STREAM,)).fetchone()
        assert not mismatched, f"seed {seed}: effects written for the wrong entry: {mismatched[:10]}"
        assert guards == (len(by_key), len(by_key)), f"seed {seed}: ProcessedMessage rows {guards}"

        # flaky: every failing entry exactly once in the DLQ; every other key handled at least once.
        dead = dead_letters(client)
        assert not [f for f in dead if f["shoal:group"] != "flaky"], f"seed {seed}: effects entries dead-lettered"
        origins = Counter(f["shoal:origin_id"] for f in dead)
        assert set(origins) == failing, (
            f"seed {seed}: dead letters {len(origins)} vs failing entries {len(failing)}; "
            f"missing {sorted(failing - set(origins))[:5]}, unexpected {sorted(set(origins) - failing)[:5]}")
        assert max(origins.values()) == 1, f"seed {seed}: dead-lettered twice: {[i for i, n in origins.items() if n > 1]}"
        assert all(f["shoal:deliveries"] == "3" and f["key"] == entries[f["shoal:origin_id"]] for f in dead)
        handled = {key: int(n) for key, n in client.hgetall(HANDLED).items()}
        assert set(handled) == passing_keys, (
            f"seed {seed}: flaky handled {len(handled)} keys of {len(passing_keys)}; "
            f"failing keys handled: {sorted(set(handled) - passing_keys)[:5]}")

        for group in client.xinfo_groups(CHAOS_STREAM):
            assert (group["pending"], group["lag"]) == (0, 0), f"seed {seed}: {group}"
        assert cluster.done["kill_worker"] >= FAULTS["worker_kills"] // 2, f"seed {seed}: faults did not land: {cluster.log}"
        assert cluster.done["restart_redis"] == FAULTS["redis_restarts"]
        assert (cluster.done["cut"], cluster.done["delay"], cluster.done["blackhole"]) == (1, 1, 1)
        logs = cluster.outputs(tail=None)
        print(f"chaos seed {seed}: {len(entries)} entries ({len(entries) - len(by_key)} stored twice by producer "
              f"retries), {len(failing)} dead-lettered, {sum(handled.values()) - len(handled)} redeliveries "
              f"in flaky, {logs.count('is a duplicate')} duplicates acked unseen by the db guard, "
              f"{logs.count('took over')} takeovers; faults {dict(cluster.done)}; handled what was published "
              f"before the end of the blackhole {drained:.1f} s after it", flush=True)
    except BaseException:
        print(cluster.outputs(), flush=True)
        raise
    finally:
        cluster.kill_all()
        proxy.stop()
