"""``runconsumer --workers N --preload`` as real processes: workers forked from a zygote, not exec'd.

Each test's handler module records the pid of the process that imported it: a worker that fork+exec'd
imported it itself, a forked worker inherited it from the zygote. So these tests fail if --preload
started workers the ordinary way.
"""
import os
import signal
import textwrap
from collections import Counter

import pytest

from tests.processes import children, cmdline
from tests.streams_app.supervisor.test_runconsumer_options import sockets
from tests.streams_app.supervisor import test_supervisor_process
from tests.streams_app.supervisor.test_supervisor_process import (  # noqa: F401  (fixtures)
    FAST, handler_app, pid_of, publish, supervise, workers,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow]

HANDLER = textwrap.dedent("""
    import os
    import time
    from streams_app import consumer
    from streams_app.redis.connection import get_connection

    VERSION = {version!r}
    IMPORTED_IN = os.getpid()

    @consumer("flow", group="g")
    def handle(message):
        get_connection().rpush("started:flow:g", message.id)
        time.sleep(message.payload.get("sleep", 0))
        get_connection().rpush("handled:flow:g", f"{{VERSION}} {{IMPORTED_IN}} {{os.getpid()}} {{message.id}}")
""")


@pytest.fixture
def preload_app(handler_app):
    write, env = handler_app

    def version(name):
        write(body=HANDLER.format(version=name))

    version("v1")
    return version, env


def handled(redis):
    """(version, pid that imported the handler, pid that ran it, entry id) per handled entry."""
    rows = [row.split(" ") for row in redis.lrange("handled:flow:g", 0, -1)]
    return [(version, int(imported), int(ran), entry_id) for version, imported, ran, entry_id in rows]


def zygotes(master):
    return [pid for pid in children(master.pid) if "runconsumer zygote" in cmdline(pid)]


def all_handled(redis, ids):
    return {row[3] for row in handled(redis)} >= set(ids) and redis.xpending("flow", "g")["pending"] == 0


@pytest.mark.both_redis
def test_preloaded_workers_are_forks_of_the_zygote_and_share_the_work(redis, supervise, preload_app):
    _, env = preload_app
    master = supervise("flow:g", "--workers", "2", "--preload", "--threads", "2", *FAST, env=env)
    wait_for(lambda: len(workers(master)) == 2, timeout=60, what="2 workers")
    [zygote] = zygotes(master)
    ids = publish(redis, "flow", [{"n": n, "sleep": 0.01} for n in range(300)])
    wait_for(lambda: all_handled(redis, ids), timeout=60, what="every entry handled and acked")
    rows = handled(redis)
    assert Counter(row[3] for row in rows) == Counter(ids), "an entry lost or handled twice"
    ran_in = {row[2] for row in rows}
    assert ran_in == set(workers(master)), "both workers, and only they, handled entries"
    assert {row[1] for row in rows} == {zygote}, "a worker imported the handler itself: not forked from the zygote"
    assert set(workers(master)) <= set(children(master.pid)), "the workers are not the master's children"
    for worker in workers(master):
        theirs = sockets(worker)
        assert theirs, "the worker has no Redis connection of its own"
        assert not theirs & (sockets(master.pid) | sockets(zygote)), "a worker shares a socket with the master or the zygote"
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()
    assert not children(master.pid)


def test_a_sigkilled_preloaded_worker_is_replaced_by_a_fork_and_nothing_is_lost(redis, supervise, preload_app):
    _, env = preload_app
    streams = {"PENDING_TIMEOUT_MS": 1500, "CLAIM_INTERVAL_MS": 300}
    ids = publish(redis, "flow", [{"n": n, "sleep": 0.02} for n in range(300)])
    master = supervise("flow:g", "--workers", "2", "--preload", "--threads", "2", *FAST, env=env, streams=streams)
    wait_for(lambda: len(workers(master)) == 2, timeout=60, what="2 workers")
    [zygote] = zygotes(master)
    wait_for(lambda: redis.llen("handled:flow:g") >= 20, timeout=30, what="work under way")
    holders = [c for c in redis.xpending("flow", "g")["consumers"] if c["pending"] > 0]
    assert holders, "no worker held unacked entries"
    victim = pid_of(holders[0]["name"])
    assert victim in workers(master)
    os.kill(victim, signal.SIGKILL)
    master.wait_for_output("crashed (signal SIGKILL)")
    wait_for(lambda: len(workers(master)) == 2 and victim not in children(master.pid), timeout=30,
             what="the killed worker replaced")
    wait_for(lambda: all_handled(redis, ids), timeout=60, what="every entry handled and acked")
    rows = handled(redis)
    assert {row[3] for row in rows} == set(ids), "entries lost"
    assert {row[1] for row in rows} == {zygote}, "the replacement was not forked from the same zygote"
    assert (set(workers(master)) - {victim}) & {row[2] for row in rows} - {victim}, "the replacement handled nothing"
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_term_drains_the_preloaded_workers_and_stops_the_zygote(redis, supervise, preload_app):
    _, env = preload_app
    master = supervise("flow:g", "--workers", "2", "--preload", "--threads", "2", "--shutdown-timeout", "20",
                       *FAST, env=env)
    wait_for(lambda: len(workers(master)) == 2, timeout=60, what="2 workers")
    assert len(zygotes(master)) == 1
    ids = publish(redis, "flow", [{"n": n, "sleep": 1} for n in range(4)])
    wait_for(lambda: redis.llen("started:flow:g") >= 4, timeout=30, what="4 handlers running")
    master.signal(signal.SIGTERM)
    assert master.wait(60) == 0, master.output()
    assert not children(master.pid), "a worker or the zygote outlived the master"
    assert {row[3] for row in handled(redis)} == set(ids), "a running handler was cut short"
    assert redis.xpending("flow", "g")["pending"] == 0


def test_hup_starts_a_new_zygote_on_the_new_code_and_replaces_every_worker(redis, supervise, preload_app):
    version, env = preload_app
    master = supervise("flow:g", "--workers", "2", "--preload", "--threads", "2", *FAST, env=env)
    wait_for(lambda: len(workers(master)) == 2, timeout=60, what="2 workers")
    [old_zygote] = zygotes(master)
    before = publish(redis, "flow", [{"n": n} for n in range(20)])
    wait_for(lambda: all_handled(redis, before), timeout=30, what="handled on v1")
    old_workers = set(workers(master))
    version("v2")
    master.signal(signal.SIGHUP)
    master.wait_for_output("rolling restart complete", timeout=60)
    wait_for(lambda: not workers(master, "stopping") and old_zygote not in children(master.pid), timeout=30,
             what="the old workers and the old zygote gone")
    [new_zygote] = zygotes(master)
    assert new_zygote != old_zygote
    assert len(workers(master)) == 2 and not set(workers(master)) & old_workers
    after = publish(redis, "flow", [{"n": n} for n in range(50)])
    wait_for(lambda: all_handled(redis, after), timeout=60, what="handled after the HUP")
    rows = {row[3]: row for row in handled(redis)}
    assert {rows[i][0] for i in before} == {"v1"}
    assert {rows[i][0] for i in after} == {"v2"}, "new entries were handled by the old code"
    assert {rows[i][1] for i in after} == {new_zygote}, "new workers were not forked from the new zygote"
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_hup_with_code_that_fails_to_import_keeps_the_old_zygote_for_replacements(redis, supervise, preload_app, handler_app):
    _, env = preload_app
    write, _ = handler_app
    master = supervise("flow:g", "--workers", "1", "--preload", *FAST, env=env)
    wait_for(lambda: len(workers(master)) == 1, timeout=60, what="1 worker")
    [zygote] = zygotes(master)
    write(body="raise ImportError('broken on purpose')\n")
    master.signal(signal.SIGHUP)
    master.wait_for_output("rolling restart aborted", timeout=60)
    assert "ImportError: broken on purpose" in master.output()
    [worker] = workers(master)
    os.kill(worker, signal.SIGKILL)  # its replacement forks from the zygote that still has v1
    wait_for(lambda: workers(master) and worker not in workers(master), timeout=30, what="a replacement")
    ids = publish(redis, "flow", [{"n": n} for n in range(5)])
    wait_for(lambda: all_handled(redis, ids), timeout=30, what="handled by the replacement")
    assert {(row[0], row[1]) for row in handled(redis)} == {("v1", zygote)}
    assert master.proc.poll() is None
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_a_hup_whose_new_zygote_is_killed_while_importing_still_rolls_out_the_new_code(redis, supervise, preload_app,
                                                                                      handler_app, tmp_path):
    # Found by a user trial: the killed zygote counted as a crashed worker, its replacement was forked
    # from the old zygote, and the rollout "completed" with every worker on the old code.
    _, env = preload_app
    write, _ = handler_app
    gate = tmp_path / "gate"
    master = supervise("flow:g", "--workers", "1", "--preload", *FAST, env=env)
    wait_for(lambda: len(workers(master)) == 1, timeout=60, what="1 worker")
    [old_zygote] = zygotes(master)
    write(body=HANDLER.format(version="v2") + textwrap.dedent(f"""
        import sys
        if sys.argv[0].endswith("zygote.py") and not os.path.exists({str(gate)!r}):
            time.sleep(600)  # the first new zygote hangs in its import until the test kills it
    """))
    master.signal(signal.SIGHUP)
    wait_for(lambda: [z for z in zygotes(master) if z != old_zygote], timeout=60, what="the new zygote")
    [hung] = [z for z in zygotes(master) if z != old_zygote]
    master.wait_for_output(f"zygote (pid {hung}) loading the consumers", timeout=60)
    gate.write_text("open")  # the next zygote imports at once
    os.kill(hung, signal.SIGKILL)
    master.wait_for_output("rolling restart complete", timeout=90)
    ids = publish(redis, "flow", [{"n": n} for n in range(20)])
    wait_for(lambda: all_handled(redis, ids), timeout=60, what="handled after the HUP")
    rows = {row[3]: row for row in handled(redis)}
    assert {rows[i][0] for i in ids} == {"v2"}, "the rollout completed on the old zygote's code"
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_a_stopped_zygote_is_killed_and_replaced_when_it_does_not_answer_a_fork(redis, supervise, preload_app):
    # Found by a user trial: a SIGSTOPped zygote held the master for 30 s per fork request, and once
    # retired it stayed behind, stopped, until the master exited.
    _, env = preload_app
    master = supervise("flow:g", "--workers", "1", "--preload", *FAST, env=env)
    wait_for(lambda: len(workers(master)) == 1, timeout=60, what="1 worker")
    [zygote] = zygotes(master)
    [worker] = workers(master)
    os.kill(zygote, signal.SIGSTOP)
    os.kill(worker, signal.SIGKILL)
    master.wait_for_output(f"zygote (pid {zygote}) did not fork", timeout=60)
    wait_for(lambda: ppid(zygote) is None, timeout=30, what="the stopped zygote killed")
    wait_for(lambda: workers(master) and worker not in workers(master), timeout=60, what="a replacement")
    ids = publish(redis, "flow", [{"n": n} for n in range(10)])
    wait_for(lambda: all_handled(redis, ids), timeout=60, what="handled by the replacement")
    assert zygote not in {row[1] for row in handled(redis) if row[3] in ids}
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


# -- the supervisor's other behaviours, unchanged with --preload -----------------------------

@pytest.fixture
def preloaded(supervise):
    """``supervise`` with --preload; each master must have started a zygote, or the test proves nothing."""
    masters = []

    def start(*args, **kwargs):
        master = supervise(*args, "--preload", **kwargs)
        masters.append(master)
        return master

    yield start
    for master in masters:
        assert "Supervisor: zygote (pid" in master.output(), "--preload started no zygote"


@pytest.mark.parametrize("test", [
    "test_autoscaling_grows_to_max_on_a_backlog_and_shrinks_to_min_when_drained",
    "test_a_worker_stuck_in_a_handler_is_killed_when_its_heartbeat_goes_stale",
    "test_metrics_expose_desired_workers_and_lag",
    "test_worker_counters_are_summed_across_workers_and_survive_a_worker_kill",
    "test_every_consumer_worker_hears_a_broadcast",
    "test_term_under_load_exits_zero_within_the_shutdown_timeout_and_loses_nothing",
])
def test_the_supervisor_behaves_the_same_with_preload(test, redis, preloaded):
    getattr(test_supervisor_process, test)(redis, preloaded)


def test_ttin_forks_one_more_worker_and_ttou_stops_one(redis, preloaded, preload_app):
    # One signal of each, waited for: the same signal twice in quick succession may be merged.
    _, env = preload_app
    master = preloaded("flow:g", "--workers", "2", *FAST, env=env)
    wait_for(lambda: len(workers(master)) == 2, timeout=60, what="2 workers")
    [zygote] = zygotes(master)
    master.signal(signal.SIGTTIN)
    wait_for(lambda: len(workers(master)) == 3, timeout=30, what="3 workers after TTIN")
    ids = publish(redis, "flow", [{"n": n, "sleep": 0.01} for n in range(100)])
    wait_for(lambda: all_handled(redis, ids), timeout=60, what="every entry handled and acked")
    assert {row[1] for row in handled(redis)} == {zygote}
    master.signal(signal.SIGTTOU)
    wait_for(lambda: len(workers(master)) == 2 and not workers(master, "stopping"), timeout=30, what="2 workers after TTOU")
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_workers_that_keep_crashing_make_the_preloaded_master_give_up_with_exit_1(redis, preloaded, handler_app):
    test_supervisor_process.test_workers_that_keep_crashing_make_the_master_give_up_with_exit_1(redis, preloaded, handler_app)


@pytest.mark.parametrize(("leftover", "why"), [
    ("threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()", "threads started while importing"),
    ("get_connection().ping()", "connections left open while importing"),
])
def test_a_consumers_module_that_leaves_a_thread_or_a_connection_is_refused(leftover, why, redis, supervise, handler_app):
    # A fork would copy the thread's locks held, or share the socket: the zygote stops before forking.
    write, env = handler_app
    write(body=HANDLER.format(version="v1") + f"\nimport threading\n{leftover}\n")
    master = supervise("flow:g", "--workers", "2", "--preload", *FAST, env=env)
    assert master.wait(60) == 3, master.output()
    out = master.output()
    assert "cannot fork workers safely (--preload): " + why in out
    assert "failed to boot" in out and "Consumer " not in out


def ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):  # gone (reading a process's stat as it is reaped raises ESRCH)
        return None


def test_the_preloaded_master_adopts_and_reaps_the_orphans_of_a_killed_worker(redis, tmp_path, supervise):
    # The master is a child subreaper (so that forked workers become its children): every orphan
    # below it comes to it too, and must not stay a zombie.
    master = supervise("spawns:g", "--workers", "1", "--preload", *FAST)
    redis.xadd("spawns", {"payload": f'{{"dir": "{tmp_path}"}}'})
    wait_for(lambda: (tmp_path / "child.pid").exists() and (tmp_path / "worker.pid").exists(), timeout=60,
             what="the handler's subprocess to start")
    worker, child = int((tmp_path / "worker.pid").read_text()), int((tmp_path / "child.pid").read_text())
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: ppid(child) in (master.pid, None), timeout=30, what="the orphan adopted by the master")
    wait_for(lambda: ppid(child) is None, timeout=30, what=f"the orphan {child} reaped (a zombie stays in /proc)")
    assert master.proc.poll() is None, master.output()
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()


def test_a_killed_preloaded_master_leaves_neither_zygote_nor_workers(redis, supervise, preload_app):
    _, env = preload_app
    master = supervise("flow:g", "--workers", "2", "--preload", *FAST, env=env)
    wait_for(lambda: len(workers(master)) == 2, timeout=60, what="2 workers")
    left = [*zygotes(master), *workers(master)]
    assert len(left) == 3
    master.kill()
    # The zygote reads end of file, the workers see their parent change; neither outlives the master.
    wait_for(lambda: all(ppid(pid) is None for pid in left), timeout=60, what="the zygote and the workers gone")


def test_a_term_while_the_zygote_is_still_importing_stops_the_master(redis, supervise, handler_app):
    # The master waits for its zygote at start-up; a stop must not wait for a slow (or hung) import.
    write, env = handler_app
    write(body=HANDLER.format(version="v1") + "\nimport sys\nif sys.argv[0].endswith('zygote.py'):\n    time.sleep(600)\n")
    master = supervise("flow:g", "--workers", "2", "--preload", "--heartbeat-interval", "1",
                       "--heartbeat-timeout", "600", env=env)
    master.wait_for_output("loading the consumers", timeout=60)
    [zygote] = zygotes(master) or [None]
    master.signal(signal.SIGTERM)
    assert master.wait(60) == 0, master.output()
    assert "stopping while zygote" in master.output()
    assert not children(master.pid) and (zygote is None or ppid(zygote) is None)


def test_a_killed_zygote_is_started_again_for_the_next_worker(redis, supervise, preload_app):
    _, env = preload_app
    master = supervise("flow:g", "--workers", "2", "--preload", *FAST, env=env)
    wait_for(lambda: len(workers(master)) == 2, timeout=60, what="2 workers")
    [zygote] = zygotes(master)
    os.kill(zygote, signal.SIGKILL)  # as the OOM killer would
    master.wait_for_output(f"zygote (pid {zygote}) exited", timeout=30)
    old = workers(master)
    assert len(old) == 2, "the workers depend on their zygote"
    for victim in old:  # both replaced, one after the other
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda victim=victim: len(workers(master)) == 2 and victim not in workers(master), timeout=60,
                 what="a replacement")
    [new_zygote] = zygotes(master)
    assert new_zygote != zygote
    ids = publish(redis, "flow", [{"n": n, "sleep": 0.01} for n in range(100)])
    wait_for(lambda: all_handled(redis, ids), timeout=60, what="every entry handled and acked")
    assert {row[1] for row in handled(redis)} == {new_zygote}, "the replacements were not forked from a new zygote"
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()
