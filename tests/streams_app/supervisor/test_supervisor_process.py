"""``runconsumer --workers/--min-workers`` as real processes: scaling, SIGKILL, HUP with new code, TERM, TTIN/TTOU.

Worker processes are found as the master's children in /proc and told apart by their process
titles (``shoal: runconsumer worker consuming ...`` / ``... stopping ...``).
"""
import json
import os
import re
import signal
import textwrap
import threading
import time
import urllib.request
from collections import Counter

import pytest

from tests.processes import children, cmdline
from tests.redis_server import free_port
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.both_redis]

FAST = ["--heartbeat-interval", "0.5", "--heartbeat-timeout", "10"]


def publish(client, stream, payloads):
    pipe = client.pipeline(transaction=False)
    for payload in payloads:
        pipe.xadd(stream, {"payload": json.dumps(payload)})
    return pipe.execute()


def workers(master, state="consuming"):
    return [pid for pid in children(master.pid) if f"runconsumer worker {state}" in cmdline(pid)]


def pid_of(consumer):
    return int(consumer.rsplit("-", 2)[1])  # <host>-<pid>-<random>; host names may contain '-'


@pytest.fixture
def supervise(run_consumer):
    """Start a supervisor; at teardown kill it and whatever workers it still has."""
    masters = []

    def start(*args, **kwargs):
        proc = run_consumer(*args, **kwargs)
        masters.append(proc)
        return proc

    yield start
    for master in masters:
        if master.proc.poll() is None:
            for pid in children(master.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            master.kill()


@pytest.fixture
def handler_app(tmp_path):
    """A throw-away Django app ``hupapp`` whose consumers.py a test rewrites under a running supervisor."""
    package = tmp_path / "hupapp"
    package.mkdir()
    (package / "__init__.py").write_text("")

    def write(version=None, body=None):
        source = body or textwrap.dedent(f"""
            import time
            from streams_app import consumer
            from streams_app.redis.connection import get_connection

            VERSION = {version!r}

            @consumer("flow", group="g")
            def handle(message):
                time.sleep(message.payload.get("sleep", 0))
                get_connection().rpush("handled:flow:g", VERSION + " " + message.id)
        """)
        (package / "consumers.py").write_text(source)

    write("v1")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
           "SHOAL_TEST_APPS": json.dumps(["hupapp"]), "PYTHONDONTWRITEBYTECODE": "1"}
    return write, env


def flow_handled(redis):
    return [row.split(" ") for row in redis.lrange("handled:flow:g", 0, -1)]


def test_autoscaling_grows_to_max_on_a_backlog_and_shrinks_to_min_when_drained(redis, supervise):
    ids = publish(redis, "jobs", [{"n": n, "sleep": 0.05} for n in range(600)])
    master = supervise("jobs:a", "--min-workers", "1", "--max-workers", "4", "--scale-interval", "1",
                       "--target-lag", "10", "--threads", "2", *FAST)
    wait_for(lambda: len(workers(master)) == 4, timeout=60, what="4 workers consuming")
    wait_for(lambda: redis.llen("handled:jobs:a") >= len(ids) and redis.xpending("jobs", "a")["pending"] == 0,
             timeout=120, what="the backlog drained")
    wait_for(lambda: len(workers(master)) == 1 and not workers(master, "stopping"), timeout=60, what="back to 1 worker")
    counts = Counter(redis.lrange("handled:jobs:a", 0, -1))
    assert set(counts) == set(ids)
    out = master.output()
    assert "autoscale: lag" in out and "workers 1 -> 3" in out and "-> 4" in out and "workers 2 -> 1" in out
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_a_sigkilled_worker_is_replaced_and_its_entries_are_taken_over(redis, supervise):
    streams = {"PENDING_TIMEOUT_MS": 1500, "CLAIM_INTERVAL_MS": 300}
    ids = publish(redis, "jobs", [{"n": n, "sleep": 0.02} for n in range(300)])
    master = supervise("jobs:a", "--workers", "2", "--threads", "2", *FAST, streams=streams)
    wait_for(lambda: len(workers(master)) == 2, timeout=30, what="2 workers")
    wait_for(lambda: redis.llen("handled:jobs:a") >= 20, timeout=30, what="work under way")
    holders = [c for c in redis.xpending("jobs", "a")["consumers"] if c["pending"] > 0]
    assert holders, "no worker held unacked entries"
    victim = pid_of(holders[0]["name"])
    assert victim in children(master.pid)
    os.kill(victim, signal.SIGKILL)
    master.wait_for_output("crashed (signal SIGKILL)")
    wait_for(lambda: len(workers(master)) == 2 and victim not in children(master.pid), timeout=30,
             what="the killed worker replaced")
    wait_for(lambda: set(redis.lrange("handled:jobs:a", 0, -1)) == set(ids) and redis.xpending("jobs", "a")["pending"] == 0,
             timeout=60, what="every entry handled and acked")
    assert master.proc.poll() is None
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_hup_loads_new_handler_code_without_loss_and_never_below_the_worker_count(redis, supervise, handler_app):
    write, env = handler_app
    master = supervise("flow:g", "--workers", "2", "--threads", "2", "--shutdown-timeout", "5", *FAST, env=env)
    wait_for(lambda: len(workers(master)) == 2, timeout=30, what="2 workers")
    published, fewest, stop = [], [2], threading.Event()
    client = redis  # a decoded client; shared by the two threads (redis-py pools are thread-safe)

    def produce():
        while not stop.is_set():
            published.extend(publish(client, "flow", [{"sleep": 0.005}] * 5))
            time.sleep(0.02)

    def watch():
        while not stop.is_set():
            fewest[0] = min(fewest[0], len(workers(master)))
            time.sleep(0.01)

    threads = [threading.Thread(target=produce), threading.Thread(target=watch)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(flow_handled(redis)) >= 50, timeout=30, what="steady flow under way")
        write("v2")
        master.signal(signal.SIGHUP)
        master.wait_for_output("rolling restart complete", timeout=60)
        wait_for(lambda: not workers(master, "stopping"), timeout=30, what="old workers gone")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    after = publish(redis, "flow", [{"n": n} for n in range(50)])
    everything = published + after
    wait_for(lambda: len(flow_handled(redis)) >= len(everything) and redis.xpending("flow", "g")["pending"] == 0,
             timeout=60, what="every entry handled and acked")
    rows = flow_handled(redis)
    counts = Counter(entry_id for _, entry_id in rows)
    assert set(counts) == set(everything), "entries lost"
    assert max(counts.values()) == 1, "an entry was handled twice"
    versions = dict((entry_id, version) for version, entry_id in rows)
    assert {versions[i] for i in after} == {"v2"}, "new entries were handled by old code"
    assert "v1" in versions.values()
    assert fewest[0] >= 2, f"only {fewest[0]} workers were consuming during the rollout"
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_term_under_load_exits_zero_within_the_shutdown_timeout_and_loses_nothing(redis, supervise):
    quick = publish(redis, "jobs", [{"n": n, "sleep": 0.01} for n in range(200)])
    stuck = publish(redis, "jobs", [{"n": n, "sleep": 60} for n in range(4)])
    master = supervise("jobs:a", "--workers", "2", "--threads", "2", "--shutdown-timeout", "2", *FAST)
    wait_for(lambda: len(set(redis.lrange("started:jobs:a", 0, -1)) & set(stuck)) >= 2, timeout=60,
             what="long handlers running")
    publish(redis, "jobs", [{"n": n, "sleep": 0.01} for n in range(100)])
    began = time.monotonic()
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()
    took = time.monotonic() - began
    assert took < 2 + 4, f"took {took:.1f}s to stop with a 2s shutdown timeout"
    assert not children(master.pid)
    started = set(redis.lrange("started:jobs:a", 0, -1))
    handled = set(redis.lrange("handled:jobs:a", 0, -1))
    pending = {p["message_id"] for p in redis.xpending_range("jobs", "a", "-", "+", 1000)}
    [group] = redis.xinfo_groups("jobs")
    delivered = {entry_id for entry_id, _ in redis.xrange("jobs", "-", group["last-delivered-id"])}
    assert started - pending <= handled, "an entry was acked without being handled"
    assert started & set(stuck) <= pending, "an interrupted handler's entry was acked"
    assert delivered <= handled | pending, "a delivered entry is neither handled nor pending: lost"
    assert set(quick) & started <= handled | pending


def test_ttin_and_ttou_add_and_remove_workers_but_never_the_last(redis, supervise):
    master = supervise("jobs:a", "--workers", "2", *FAST)
    wait_for(lambda: len(workers(master)) == 2, timeout=30, what="2 workers")
    master.signal(signal.SIGTTIN)
    wait_for(lambda: len(workers(master)) == 3, timeout=30, what="3 workers after TTIN")
    # One TTOU at a time, each awaited: two sent close together may be merged into one by the kernel
    # (a pending standard signal is not queued twice), which a loaded machine makes likely at any spacing.
    for expected in (2, 1):
        master.signal(signal.SIGTTOU)
        wait_for(lambda n=expected: len(workers(master)) == n and not workers(master, "stopping"), timeout=30,
                 what=f"{expected} worker(s) after a TTOU")
    master.signal(signal.SIGTTOU)
    master.wait_for_output("already at 1 workers, the minimum", timeout=30)
    assert len(workers(master)) == 1
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_a_handler_module_that_fails_to_import_halts_the_master_without_a_respawn_loop(redis, supervise, handler_app):
    write, env = handler_app
    master = supervise("flow:g", "--workers", "1", *FAST, env=env)
    wait_for(lambda: len(workers(master)) == 1, timeout=30, what="1 worker")
    write(body="raise ImportError('broken on purpose')\n")
    master.signal(signal.SIGTTIN)  # a new worker imports the broken module
    assert master.wait(60) == 3
    out = master.output()
    assert "ImportError: broken on purpose" in out
    assert "failed to boot" in out
    assert out.count("spawned worker") == 2, "the broken worker was started again"
    assert re.search(r"worker 1 \(pid \d+\) stopped \(exit 0\)", out), "the good worker was not drained"


def test_hup_with_code_that_fails_to_import_keeps_the_old_workers_consuming(redis, supervise, handler_app):
    write, env = handler_app
    master = supervise("flow:g", "--workers", "1", *FAST, env=env)
    wait_for(lambda: len(workers(master)) == 1, timeout=30, what="1 worker")
    write(body="raise ImportError('broken on purpose')\n")
    master.signal(signal.SIGHUP)
    master.wait_for_output("rolling restart aborted", timeout=60)
    ids = publish(redis, "flow", [{"n": n} for n in range(5)])
    wait_for(lambda: sorted(row[1] for row in flow_handled(redis)) == sorted(ids), timeout=30, what="handled by the old worker")
    assert {row[0] for row in flow_handled(redis)} == {"v1"}
    assert master.proc.poll() is None and master.output().count("spawned worker") == 2
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_workers_that_keep_crashing_make_the_master_give_up_with_exit_1(redis, supervise, handler_app):
    write, env = handler_app
    write(body=textwrap.dedent("""
        import os
        from streams_app import consumer

        @consumer("flow", group="g")
        def handle(message):
            os._exit(1)  # the whole worker process dies
    """))
    publish(redis, "flow", [{"n": n} for n in range(10)])
    # One thread: a worker reads at most 2 entries, so each new worker gets fresh ones to crash on.
    master = supervise("flow:g", "--workers", "1", "--threads", "1", *FAST, env=env,
                       streams={"RESTART_DELAY": 0.1, "CRASH_LIMIT": 3, "CRASH_WINDOW": 600})
    assert master.wait(60) == 1
    out = master.output()
    assert out.count("crashed (exit 1)") == 2 and "3 worker crashes within 600s; giving up" in out
    assert out.count("spawned worker") == 3
    assert "replacing it in 0.1s" in out and "replacing it in 0.2s" in out  # the delay grows


def test_a_broken_handler_module_at_start_is_reported_and_nothing_is_spawned(redis, supervise, handler_app):
    write, env = handler_app
    write(body="raise ImportError('broken on purpose')\n")
    master = supervise("flow:g", "--workers", "2", *FAST, env=env)
    assert master.wait(60) != 0
    out = master.output()
    assert "broken on purpose" in out and "spawned worker" not in out


def test_a_worker_stuck_in_a_handler_is_killed_when_its_heartbeat_goes_stale(redis, supervise):
    publish(redis, "jobs", [{"sleep": 3600}])
    master = supervise("jobs:a", "--workers", "1", "--threads", "1",
                       "--heartbeat-interval", "0.2", "--heartbeat-timeout", "3")
    wait_for(lambda: redis.llen("started:jobs:a") == 1, timeout=90, what="the handler stuck")
    [first] = workers(master)
    master.wait_for_output("no heartbeat for", timeout=30)
    wait_for(lambda: workers(master) and first not in workers(master), timeout=30, what="a replacement")
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_metrics_expose_desired_workers_and_lag(redis, supervise):
    publish(redis, "jobs", [{"n": n} for n in range(3)])
    port = free_port()
    master = supervise("jobs:a", "jobs:b", "--workers", "2", "--metrics-port", str(port), "--scale-interval", "0.5", *FAST)
    wait_for(lambda: len(workers(master)) == 2, timeout=30, what="2 workers")
    wait_for(lambda: redis.llen("handled:jobs:b") == 3, timeout=30, what="handled")

    def scrape():
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()

    wait_for(lambda: 'shoal_supervisor_group_lag{group="b",stream="jobs"} 0.0' in scrape(), timeout=30,
             what="lag gauge at 0 after draining")
    # The master counts a worker as consuming at its first heartbeat, a little after its title says so.
    wait_for(lambda: 'shoal_supervisor_workers{state="consuming"} 2.0' in scrape(), timeout=30,
             what="2 consuming workers in the metrics")
    text = scrape()
    assert "shoal_supervisor_desired_workers 2.0" in text
    assert 'shoal_supervisor_group_lag_estimated{group="a",stream="jobs"} 0.0' in text
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_worker_counters_are_summed_across_workers_and_survive_a_worker_kill(redis, supervise):
    port = free_port()
    master = supervise("jobs:a", "--workers", "2", "--metrics-port", str(port), *FAST)
    wait_for(lambda: len(workers(master)) == 2, timeout=30, what="2 workers")
    publish(redis, "jobs", [{"n": n} for n in range(200)])
    # handled first: the group exists by then (a worker may report itself consuming a moment before).
    wait_for(lambda: redis.llen("handled:jobs:a") == 200 and redis.xinfo_groups("jobs")[0]["pending"] == 0,
             timeout=30, what="200 handled and acked")

    def handled():
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith('shoal_messages_handled_total{group="a",stream="jobs"}'):
                return float(line.split()[-1])
        return 0.0

    wait_for(lambda: handled() == 200, timeout=10, what="the sum over both workers at 200")
    os.kill(workers(master)[0], signal.SIGKILL)
    wait_for(lambda: len(workers(master)) == 2, timeout=30, what="the killed worker replaced")
    assert handled() == 200, "a dead worker's counts were lost"
    publish(redis, "jobs", [{"n": n} for n in range(50)])
    seen = []
    wait_for(lambda: seen.append(handled()) or seen[-1] == 250, timeout=30,
             what=f"counts from the new worker added (last scrapes: {seen[-3:]})")
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_every_consumer_worker_hears_a_broadcast(redis, supervise):
    from streams_app.broadcast import broadcast
    from streams_app.redis.connection import node_client

    master = supervise("jobs:a", "--workers", "2", *FAST)
    wait_for(lambda: dict(node_client(redis, "shoal:broadcast").pubsub_numsub("shoal:broadcast")).get("shoal:broadcast") == 2, timeout=30,
             what="2 workers subscribed")
    assert broadcast("ping", {"reply_to": "acks"}) == 2
    wait_for(lambda: redis.hlen("acks") == 2, timeout=10, what="2 acknowledgements")
    assert sorted(int(pid) for pid in redis.hkeys("acks")) == sorted(workers(master))
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_a_hup_that_arrives_while_the_master_starts_does_not_kill_it(redis, supervise):
    master = supervise("jobs:a", "--workers", "1", *FAST)

    def ignores_hup():
        status = open(f"/proc/{master.pid}/status").read()
        mask = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
        return mask & (1 << (signal.SIGHUP - 1))

    # As soon as manage.py runs: Django is still starting, the supervisor's handlers are not in place.
    wait_for(ignores_hup, timeout=30, what="manage.py ignoring SIGHUP during start-up")
    master.signal(signal.SIGHUP)
    master.signal(signal.SIGTTIN)
    master.wait_for_output("Supervisor: started", timeout=60)
    wait_for(lambda: len(workers(master)) >= 1, timeout=30, what="a consuming worker")
    assert master.proc.poll() is None
    # The workers still take the default action of the signals the master relays to them.
    publish(redis, "jobs", [{"n": 1}])
    wait_for(lambda: redis.llen("handled:jobs:a") == 1, timeout=30, what="handled")
    master.signal(signal.SIGHUP)  # now a rolling restart
    master.wait_for_output("rolling", timeout=30)
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()
