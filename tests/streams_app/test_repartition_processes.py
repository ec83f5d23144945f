"""manage.py repartition on a local 3-master cluster while a producer publishes and runconsumer --workers 2
(ordered=True) consumes: nothing lost, per-key order kept, every process follows; with SIGKILLs too."""
import json
import os
import signal
import threading
import time

import pytest

from streams_app import publish, publish_many
from streams_app.partitioning import layout, partitions
from tests.processes import descendants
from tests.streams_app.consuming.test_ordered import LEASES, assert_per_key_order, keyed
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

KEYS = [f"customer-{k}" for k in range(40)]
TOTAL = 6000


@pytest.fixture
def redis_kind():
    return "cluster"


@pytest.fixture
def ordered4(settings, redis):
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"ordered": 4}, **LEASES}
    return list(partitions.names("ordered"))


class Producer(threading.Thread):
    """Publishes TOTAL messages over the 40 keys, ``n`` counting up: per key, n only grows."""

    def __init__(self, pause):
        super().__init__(daemon=True)
        self.pause, self.sent, self.error = pause, 0, None

    def run(self):
        try:
            for n in range(TOTAL):
                key = KEYS[n % len(KEYS)]
                publish("ordered", {"key": key, "n": n}, key=key)
                self.sent = n + 1
                time.sleep(self.pause)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def gate_waits(output):
    """Seconds each new partition's ordered loop waited ("waits for" to "reads now", from the log lines):
    how long a key's first message after the switch may wait at most."""
    import datetime
    import re

    began, waits = {}, {}
    for line in output.splitlines():
        found = re.match(r"(\S+ \S+) INFO .*?: (\S+)/o (?:\(epoch \d+\) )?(waits for|reads now)", line)
        if not found:
            continue
        at = datetime.datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if found[3] == "waits for":
            began.setdefault(found[2], at)
        elif found[2] in began:
            waits[found[2]] = max(waits.get(found[2], 0), at - began[found[2]])
    return waits


def waited(output):
    waits = gate_waits(output)
    if not waits:  # the workers restarted after the seal, their feeders drained: no loop had to wait
        return "0 s (no new partition had to wait)"
    return f"{min(waits.values()):.1f}-{max(waits.values()):.1f}s ({len(waits)} partitions)"


def expected():
    return {key: [n for n in range(TOTAL) if KEYS[n % len(KEYS)] == key] for key in KEYS}


def handled(redis):
    return sum(redis.llen(f"seen:{key}") for key in KEYS)


def start(run_consumer, ordered_streams):
    return run_consumer("ordered:o", "--workers", "2", "--threads", "2", streams=ordered_streams)


STREAMS = {"PARTITIONS": {"ordered": 4}, **LEASES}


def consuming_and_publishing(run_consumer, redis, ordered4, seconds):
    """``runconsumer --workers 2`` holding the 4 leases, and a Producer that has published for ``seconds``."""
    consumers = start(run_consumer, STREAMS)
    wait_for(lambda: redis.exists(*[f"{{{p}}}:lease:o" for p in ordered4]) == 4, timeout=90,
             what="the workers to hold the 4 leases")
    producer = Producer(pause=0.003)
    began = time.monotonic()
    producer.start()
    wait_for(lambda: time.monotonic() - began >= seconds, timeout=20, what=f"{seconds} seconds of publishing")
    return consumers, producer


def test_done_when_4_to_8_while_publishing_and_consuming(ordered4, redis, run_consumer):
    consumers, producer = consuming_and_publishing(run_consumer, redis, ordered4, 8)
    command = run_consumer("ordered", "8", command="repartition", streams=STREAMS)
    switched = time.monotonic()
    assert command.wait(timeout=240) == 0, command.output()
    took = time.monotonic() - switched
    producer.join(timeout=240)
    assert producer.error is None and producer.sent == TOTAL, producer.error
    out = command.output()
    for phase in ("prepare:", "switch:", "seal:", "drain:", "retire: done, 8 partitions"):
        assert phase in out, out
    wait_for(lambda: handled(redis) >= TOTAL, timeout=180, what=f"{TOTAL} handled")
    assert handled(redis) == TOTAL, "handled twice"
    assert_per_key_order(redis, KEYS, expected())
    layout.forget()
    new = partitions.names("ordered")
    assert len(new) == 8 and not set(new) & set(ordered4)
    # A new process's keyed publishes land on at least 6 of the 8.
    before = {name: redis.xlen(name) for name in new}
    code = ("from streams_app import publish\n"
            "for k in range(200):\n    publish('ordered', {'key': 'fresh-%d' % k, 'n': k}, key='fresh-%d' % k)\n")
    fresh = run_consumer("-c", code, command="shell", streams=STREAMS)
    assert fresh.wait(timeout=60) == 0, fresh.output()
    landed = [name for name in new if redis.xlen(name) > before[name]]
    assert len(landed) >= 6, landed
    assert "layout of ordered changed" in consumers.output()
    print(f"repartition 4 -> 8 under load: {took:.1f}s (command start to exit); {len(landed)} of 8 got fresh keys; "
          f"ordered gates waited {waited(consumers.output())}")


def test_sigkills_of_a_worker_and_of_the_command_during_the_change(ordered4, redis, run_consumer):
    consumers, producer = consuming_and_publishing(run_consumer, redis, ordered4, 5)
    first = run_consumer("ordered", "8", command="repartition", streams=STREAMS)
    first.wait_for_output("switch:", timeout=60)
    first.kill()  # killed between the switch and the seal: the lock lapses, a new run resumes
    again = run_consumer("ordered", "8", command="repartition", streams=STREAMS)
    assert again.wait(timeout=60) == 1 and "another repartition of this stream is running" in again.output()
    workers = descendants(consumers.pid)
    assert workers
    victim = workers[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: not redis.exists("ordered:repartition:lock") and not redis.exists("{ordered}:repartition:lock"),
             timeout=30, what="the killed run's lock to lapse")
    resumed = run_consumer("ordered", "8", command="repartition", streams=STREAMS)
    assert resumed.wait(timeout=240) == 0, resumed.output()
    assert "resuming the change from 4 to 8" in resumed.output()
    producer.join(timeout=240)
    assert producer.error is None and producer.sent == TOTAL
    wait_for(lambda: len({int(n) for key in KEYS for n in redis.lrange(f"seen:{key}", 0, -1)}) >= TOTAL,
             timeout=180, what=f"all {TOTAL} handled")
    assert_per_key_order(redis, KEYS, expected())  # a takeover may repeat a key's suffix, never reorder
    twice = handled(redis) - TOTAL
    record = json.loads(redis.get("{ordered}:layout"))
    assert record["state"] == "stable" and len(record["names"]) == 8
    print(f"handled again after the SIGKILL of worker {victim}: {twice}")


def test_a_new_partition_waits_for_the_backlog_of_its_feeder(ordered4, redis, run_consumer):
    """A backlog in the previous partitions when the consumers start: without the gate the new partitions'
    entries of a key would be handled before the older ones still waiting in its previous partition."""
    before, names = keyed(800, KEYS[:8])
    publish_many("ordered", before, keys=names)
    sealed = run_consumer("ordered", "8", "--no-wait", command="repartition", streams=STREAMS)
    assert sealed.wait(timeout=60) == 0, sealed.output()
    layout.forget()
    after, names = keyed(800, KEYS[:8], first=800)
    publish_many("ordered", after, keys=names)
    assert sum(redis.xlen(p) for p in partitions.names("ordered")) == 800  # in the new partitions
    draining = run_consumer("ordered", "8", command="repartition", streams=STREAMS)
    draining.wait_for_output("entries left", timeout=60)  # nothing consumes yet: it waits in the drain
    draining.kill()  # killed in the drain: running again finishes the job
    consumers = start(run_consumer, STREAMS)
    wait_for(lambda: not redis.exists("{ordered}:repartition:lock"), timeout=30, what="the killed run's lock to lapse")
    finish = run_consumer("ordered", "8", command="repartition", streams=STREAMS)
    assert finish.wait(timeout=240) == 0, finish.output()
    assert "resuming the change from 4 to 8" in finish.output()
    wait_for(lambda: sum(redis.llen(f"seen:{key}") for key in KEYS[:8]) >= 1600, timeout=120, what="1600 handled")
    expected = {key: [p["n"] for p in before + after if p["key"] == key] for key in KEYS[:8]}
    assert_per_key_order(redis, KEYS[:8], expected)
    assert "waits for" in consumers.output()
    print(f"with a backlog of 800 in the previous partitions: gates waited {waited(consumers.output())}")


def test_runconsumer_without_a_supervisor_follows_in_the_same_process(ordered4, redis, run_consumer):
    before, names = keyed(200, KEYS[:4])
    publish_many("ordered", before, keys=names)
    alone = run_consumer("ordered:o", streams=STREAMS)
    wait_for(lambda: sum(redis.llen(f"seen:{key}") for key in KEYS[:4]) >= 200, timeout=90, what="200 handled")
    command = run_consumer("ordered", "6", command="repartition", streams=STREAMS)
    command.wait_for_output("seal: the previous partitions", timeout=60)
    layout.forget()
    after, names = keyed(200, KEYS[:4], first=200)
    publish_many("ordered", after, keys=names)
    assert command.wait(timeout=120) == 0, command.output()
    wait_for(lambda: sum(redis.llen(f"seen:{key}") for key in KEYS[:4]) >= 400, timeout=90, what="400 handled")
    expected = {key: [p["n"] for p in before + after if p["key"] == key] for key in KEYS[:4]}
    assert_per_key_order(redis, KEYS[:4], expected)
    wait_for(lambda: alone.output().count("started (") >= 3, timeout=30, what="three starts: 4, 4+6, then 6 partitions")
    assert alone.proc.poll() is None  # the same process, never restarted
    assert "ordered:e1.0" in alone.output().split("started (")[-1].splitlines()[0]


def test_preloaded_workers_follow_too(ordered4, redis, run_consumer):
    """--preload forks workers from a zygote that selected the consumers before the change: each worker
    makes its specs from the live layout, instead of starting on the zygote's and stopping at once."""
    consumers = run_consumer("ordered:o", "--workers", "2", "--preload", streams=STREAMS)
    wait_for(lambda: consumers.output().count("started (") >= 2, timeout=90, what="two workers")
    before, names = keyed(200, KEYS[:4])
    publish_many("ordered", before, keys=names)
    command = run_consumer("ordered", "8", command="repartition", streams=STREAMS)
    assert command.wait(timeout=120) == 0, command.output()
    layout.forget()
    after, names = keyed(200, KEYS[:4], first=200)
    publish_many("ordered", after, keys=names)
    wait_for(lambda: sum(redis.llen(f"seen:{key}") for key in KEYS[:4]) >= 400, timeout=90, what="400 handled")
    expected = {key: [p["n"] for p in before + after if p["key"] == key] for key in KEYS[:4]}
    assert_per_key_order(redis, KEYS[:4], expected)
    # 2 workers x (start, change, retire): each forked worker started on the live layout, not the zygote's.
    wait_for(lambda: consumers.output().count("started (") >= 6, timeout=60, what="three starts of each worker")
    assert "ordered:e1.0" in consumers.output().split("started (")[-1].splitlines()[0]


def test_ctrl_c_stops_the_command_in_one_line_and_a_rerun_finishes(ordered4, redis, run_consumer):
    """SIGINT while the drain waits (no consumer runs): one line, exit 1, the lock released at once."""
    publish_many("ordered", [{"key": "a", "n": n} for n in range(10)], keys=["a"] * 10)
    command = run_consumer("ordered", "8", command="repartition", streams=STREAMS)
    command.wait_for_output("entries left", timeout=60)
    command.signal(signal.SIGINT)
    assert command.wait(timeout=30) == 1
    assert "stopped; nothing is lost" in command.output() and "Traceback" not in command.output()
    assert not redis.exists("{ordered}:repartition:lock")
    start(run_consumer, STREAMS)
    again = run_consumer("ordered", "8", command="repartition", streams=STREAMS)
    assert again.wait(timeout=120) == 0, again.output()
    wait_for(lambda: redis.llen("seen:a") >= 10, timeout=60, what="the 10 handled")
