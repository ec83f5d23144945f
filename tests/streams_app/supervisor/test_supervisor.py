"""The supervisor's loop, one ``tick(now)`` at a time, with fake worker processes (no fork, no Redis).

The real processes are in test_supervisor_process.py; here every branch of the arbiter logic is
driven deterministically: crash back-off and limit, boot errors, heartbeats, rolling restarts,
TTIN/TTOU, two-stage stop, and autoscaling on the lag.
"""
import signal
import threading
import time

import pytest
import redis as redis_lib

from streams_app.supervisor.autoscale import Autoscaler, decide
from streams_app.redis.lag import GroupLag
from streams_app.supervisor.master import EXIT_BOOT_ERROR, EXIT_CRASH_LOOP, EXIT_FORCED, EXIT_OK, STOP_GRACE, Supervisor


class FakeProc:
    def __init__(self, pid):
        self.pid = pid
        self.returncode = None
        self.signals = []

    def poll(self):
        return self.returncode

    def send_signal(self, sig):
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        self.signals.append(sig)
        if sig == signal.SIGKILL:
            self.returncode = -signal.SIGKILL

    def exit(self, code):
        self.returncode = code


class FakeHeartbeat:
    def __init__(self):
        self.beat = 0.0
        self.closed = False

    def last_beat(self):
        return self.beat

    def close(self):
        self.closed = True


class Spawner:
    def __init__(self):
        self.procs = []

    def __call__(self, number):
        proc = FakeProc(1000 + number)
        proc.heartbeat = FakeHeartbeat()
        self.procs.append(proc)
        return proc, proc.heartbeat


class Stamp:
    """A beat stamp later than every tick of these tests: a worker that beat once never goes stale."""
    now = 1_000_000.0

    def __call__(self):
        return self.now


def make(**kwargs):
    spawner = Spawner()
    wall = Stamp()
    options = dict(shutdown_timeout=10.0, heartbeat_timeout=30.0, restart_delay=1.0, crash_limit=10,
                   crash_window=600.0, set_title=lambda title: None)
    options.update(kwargs)
    return Supervisor(spawner, **options), spawner, wall


def beat_all(spawner, wall):
    for proc in spawner.procs:
        proc.heartbeat.beat = wall.now


def alive(spawner):
    return [p for p in spawner.procs if p.returncode is None]


def test_starts_the_desired_workers_and_counts_them_consuming_after_their_first_beat():
    sup, spawner, wall = make(workers=3)
    sup.tick(0)
    assert len(spawner.procs) == 3
    assert not any(w.ready for w in sup.workers.values())
    beat_all(spawner, wall)
    sup.tick(0.1)
    assert all(w.ready for w in sup.workers.values())
    assert len(spawner.procs) == 3  # nothing more spawned


def test_a_crashed_worker_is_replaced_after_a_delay_that_grows_while_crashes_continue():
    sup, spawner, wall = make(workers=1)
    sup.tick(0)
    spawner.procs[0].exit(1)
    sup.tick(10.0)
    assert len(spawner.procs) == 1  # not at once
    sup.tick(10.9)
    assert len(spawner.procs) == 1
    sup.tick(11.0)
    assert len(spawner.procs) == 2  # after 1 s
    spawner.procs[1].returncode = -signal.SIGSEGV
    sup.tick(12.0)
    sup.tick(13.9)
    assert len(spawner.procs) == 2  # the second crash in the window waits 2 s
    sup.tick(14.0)
    assert len(spawner.procs) == 3


def test_too_many_crashes_in_the_window_halt_the_master_with_a_non_zero_exit():
    sup, spawner, wall = make(workers=2, crash_limit=3, crash_window=1000.0, heartbeat_timeout=1e6)
    now = 0.0
    sup.tick(now)
    for _ in range(2):
        alive(spawner)[0].exit(1)
        now += 0.1
        sup.tick(now)
        now += 60
        sup.tick(now)  # delay elapsed: replaced
    assert len(alive(spawner)) == 2 and not sup.stopping
    alive(spawner)[0].exit(1)
    sup.tick(now + 1)
    assert sup.stopping and sup.exit_code == EXIT_CRASH_LOOP
    [survivor] = alive(spawner)
    assert survivor.signals == [signal.SIGTERM]  # the others are stopped gracefully, not respawned
    count = len(spawner.procs)
    survivor.exit(0)
    sup.tick(now + 200)
    assert sup.done and len(spawner.procs) == count


def test_crashes_older_than_the_window_are_forgotten():
    sup, spawner, wall = make(workers=1, crash_limit=2, crash_window=10.0)
    sup.tick(0)
    spawner.procs[-1].exit(1)
    sup.tick(1)
    sup.tick(2)
    spawner.procs[-1].exit(1)
    sup.tick(20)  # the first crash is out of the window: one crash counted, delay back to 1 s
    assert not sup.stopping
    sup.tick(21)
    assert len(spawner.procs) == 3


def test_a_worker_that_fails_to_boot_halts_the_master_instead_of_being_respawned():
    sup, spawner, wall = make(workers=2)
    sup.tick(0)
    spawner.procs[0].exit(EXIT_BOOT_ERROR)
    for now in (0.5, 5, 10):
        sup.tick(now)
    assert sup.stopping and sup.exit_code == EXIT_BOOT_ERROR
    assert len(spawner.procs) == 2
    assert spawner.procs[1].signals == [signal.SIGTERM]
    spawner.procs[1].exit(0)
    sup.tick(60)
    assert sup.done


def test_a_worker_whose_heartbeat_goes_stale_is_killed_and_replaced():
    sup, spawner, wall = make(workers=1, heartbeat_timeout=30.0)
    sup.tick(0)
    spawner.procs[0].heartbeat.beat = 1.0  # beats are readings of the supervisor's (monotonic) clock
    sup.tick(1)
    sup.tick(30)
    assert spawner.procs[0].signals == []
    sup.tick(32)
    assert spawner.procs[0].signals == [signal.SIGKILL]
    sup.tick(32.1)  # reaped: counted as a crash
    sup.tick(33.1)
    assert len(spawner.procs) == 2


def test_a_worker_that_never_beats_is_killed_after_the_heartbeat_timeout():
    sup, spawner, wall = make(workers=1, heartbeat_timeout=30.0)
    sup.tick(0)
    sup.tick(29)
    assert spawner.procs[0].signals == []
    sup.tick(31)
    assert spawner.procs[0].signals == [signal.SIGKILL]


def test_hup_replaces_workers_one_at_a_time_and_stops_each_only_once_its_successor_consumes():
    sup, spawner, wall = make(workers=2)
    sup.tick(0)
    beat_all(spawner, wall)
    sup.tick(1)
    old = list(spawner.procs)
    sup.signals.put(signal.SIGHUP)
    sup.tick(2)
    assert len(spawner.procs) == 3
    assert all(p.signals == [] for p in old)
    sup.tick(3)  # the new one has not beaten yet: nothing is stopped
    assert all(p.signals == [] for p in old) and len(spawner.procs) == 3
    consuming_counts = []
    for step in range(6):
        beat_all(spawner, wall)
        sup.tick(4 + step)
        consuming_counts.append(sum(1 for w in sup.workers.values() if w.ready and not w.stopping))
        for proc in old:  # a stopped old worker drains and exits
            if proc.signals and proc.returncode is None:
                proc.exit(0)
    assert [p.signals for p in old] == [[signal.SIGTERM], [signal.SIGTERM]]
    assert len(spawner.procs) == 4
    assert min(consuming_counts) >= 2
    assert not sup.reload_queue
    assert sorted(sup.workers) == [p.pid for p in spawner.procs[2:]]


def test_a_hup_during_a_rollout_replaces_the_rollouts_extra_worker_too():
    # The extra worker of the first rollout runs the code of the first HUP. Before the fix the second
    # rollout's queue held only the two original workers, so that one stayed on the intermediate code.
    sup, spawner, wall = make(workers=2)
    sup.tick(0)
    beat_all(spawner, wall)
    sup.tick(1)
    sup.signals.put(signal.SIGHUP)
    sup.tick(2)
    [first_surge] = spawner.procs[2:]
    sup.signals.put(signal.SIGHUP)  # the code changed again before the rollout got far
    sup.tick(3)
    assert first_surge.pid in sup.reload_queue
    for step in range(20):
        beat_all(spawner, wall)
        sup.tick(4 + step)
        for proc in spawner.procs:  # a stopped worker drains and exits
            if proc.signals and proc.returncode is None:
                proc.exit(0)
    assert not sup.reload_queue
    assert first_surge.signals == [signal.SIGTERM]
    assert sorted(sup.workers) == [p.pid for p in spawner.procs[-2:]] and first_surge.pid not in sup.workers


def test_a_replacement_that_fails_to_boot_aborts_the_rolling_restart_and_keeps_the_old_workers():
    sup, spawner, wall = make(workers=2)
    sup.tick(0)
    beat_all(spawner, wall)
    sup.tick(1)
    sup.signals.put(signal.SIGHUP)
    sup.tick(2)
    [new] = spawner.procs[2:]
    new.exit(EXIT_BOOT_ERROR)
    for now in (3, 4, 5):
        beat_all(spawner, wall)
        sup.tick(now)
    assert not sup.stopping and not sup.reload_queue
    assert len(spawner.procs) == 3  # not respawned
    assert [p.signals for p in spawner.procs[:2]] == [[], []]  # the old ones keep consuming


def test_ttin_and_ttou_change_the_count_but_never_below_one():
    sup, spawner, wall = make(workers=1)
    sup.tick(0)
    sup.signals.put(signal.SIGTTIN)
    sup.signals.put(signal.SIGTTIN)
    sup.tick(1)
    assert sup.desired == 3 and len(alive(spawner)) == 3
    for _ in range(4):
        sup.signals.put(signal.SIGTTOU)
    sup.tick(2)
    assert sup.desired == 1
    stopped = [p for p in spawner.procs if p.signals == [signal.SIGTERM]]
    assert len(stopped) == 2


def test_term_stops_gracefully_and_kills_stragglers_after_the_shutdown_timeout():
    sup, spawner, wall = make(workers=2, shutdown_timeout=10.0)
    sup.tick(0)
    sup.signals.put(signal.SIGTERM)
    sup.tick(1)
    assert [p.signals for p in spawner.procs] == [[signal.SIGTERM]] * 2
    spawner.procs[0].exit(0)
    sup.tick(2)
    assert not sup.done
    sup.tick(1 + 10 + STOP_GRACE - 0.01)
    assert spawner.procs[1].signals == [signal.SIGTERM]
    sup.tick(1 + 10 + STOP_GRACE)
    assert spawner.procs[1].signals == [signal.SIGTERM, signal.SIGKILL]
    sup.tick(17)
    assert sup.done and sup.exit_code == EXIT_OK
    assert len(spawner.procs) == 2  # nothing respawned while stopping


def test_a_second_signal_tells_workers_to_stop_at_once():
    sup, spawner, wall = make(workers=2)
    sup.tick(0)
    sup.signals.put(signal.SIGTERM)
    sup.tick(1)
    sup.signals.put(signal.SIGINT)
    sup.tick(2)
    assert all(p.signals == [signal.SIGTERM, signal.SIGINT] for p in spawner.procs)
    sup.tick(3.01)  # a second later anything left is killed
    assert all(p.returncode == -signal.SIGKILL for p in spawner.procs)
    sup.tick(3.1)
    assert sup.done and sup.exit_code == EXIT_FORCED


def test_autoscaling_follows_the_lag_between_min_and_max():
    lags = [[GroupLag("jobs", "a", 1000)]]
    sup, spawner, wall = make(autoscaler=Autoscaler(minimum=1, maximum=4, target=100, interval=5.0),
                              lag_reader=lambda: lags[-1])
    sup.tick(0)
    assert sup.desired == 3 and len(spawner.procs) == 3  # 1 -> 3 at once
    sup.tick(4.9)
    assert sup.desired == 3  # not before the interval
    sup.tick(5)
    assert sup.desired == 4 and len(alive(spawner)) == 4
    lags.append([GroupLag("jobs", "a", 49, estimated=True)])
    for now in (10, 15, 20, 25):
        sup.tick(now)
        for proc in alive(spawner):
            if proc.signals:
                proc.exit(0)
    assert sup.desired == 1 and len(alive(spawner)) == 1


def test_an_unreadable_backlog_changes_nothing():
    def broken():
        raise redis_lib.ConnectionError("down")

    sup, spawner, wall = make(autoscaler=Autoscaler(minimum=2, maximum=4, target=100, interval=1.0), lag_reader=broken)
    for now in range(5):
        sup.tick(now)
    assert sup.desired == 2 and len(spawner.procs) == 2


@pytest.mark.parametrize(
    ("lag", "current", "expected"),
    [(201, 1, 3), (201, 3, 4), (200, 2, 2), (100, 2, 2), (50, 2, 2), (49, 2, 1), (0, 1, 1), (10_000, 4, 4), (0, 9, 3)],
)
def test_seed_000_rule(lag, current, expected):
    assert decide(lag, current, minimum=1, maximum=4, target=100) == expected


def test_the_loop_wakes_up_when_a_restart_is_due_not_a_full_slow_tick_later():
    clock = [0.0]
    sup, spawner, wall = make(workers=1, restart_delay=0.25, clock=lambda: clock[0])
    sup.tick()
    beat_all(spawner, wall)
    sup.tick()
    assert sup.tick_seconds() == 1.0  # all is well: the slow pace
    spawner.procs[0].exit(1)
    sup.tick()
    assert sup.tick_seconds() == 0.25
    clock[0] = 0.2
    assert sup.tick_seconds() == 0.1


class SteppingWall:
    """time.time() as NTP or a VM resume makes it: it jumps while the monotonic clock runs on."""

    def __init__(self):
        self.offset = 0.0
        self.real = time.time

    def __call__(self):
        return self.real() + self.offset


@pytest.mark.parametrize("step", [3600.0, -3600.0], ids=["forward", "backward"])
def test_heartbeats_ignore_wall_clock_steps(monkeypatch, step):
    from streams_app.supervisor.heartbeat import Beater, HeartbeatFile, ProgressExecutor

    wall = SteppingWall()
    monkeypatch.setattr(time, "time", wall)
    clock = {"now": 500.0}

    def monotonic():
        return clock["now"]

    files = []

    def spawner(number):
        proc = FakeProc(1000 + number)
        files.append(HeartbeatFile())
        return proc, files[-1]

    sup = Supervisor(spawner, workers=1, shutdown_timeout=10.0, heartbeat_timeout=30.0, restart_delay=1.0,
                     crash_limit=10, crash_window=600.0, clock=monotonic, set_title=lambda title: None)
    executor = ProgressExecutor(1, clock=monotonic)
    beater = Beater(None, 5.0, clock=monotonic)
    worker = type("W", (), {"executor": executor})()
    release = threading.Event()
    try:
        sup.tick(clock["now"])
        beater.fd = files[0].fd
        beater(worker)
        sup.tick(clock["now"])
        (supervised,) = sup.workers.values()
        proc = supervised.proc
        assert supervised.ready

        wall.offset = step  # the wall clock steps; one second passes
        clock["now"] += 1
        beater(worker)
        sup.tick(clock["now"])
        assert proc.signals == [], "a wall-clock step must not make a healthy worker look stuck"

        started = threading.Event()
        executor.submit(lambda: (started.set(), release.wait(30)))
        assert started.wait(10)
        clock["now"] += 29  # stuck for 29 s: not yet
        beater(worker)
        sup.tick(clock["now"])
        assert proc.signals == []
        clock["now"] += 7  # stuck for 36 s, whatever the wall clock says
        beater(worker)
        sup.tick(clock["now"])
        assert proc.signals == [signal.SIGKILL], "a stuck worker is replaced after the heartbeat timeout"
    finally:
        release.set()
        executor.shutdown()
        for f in files:
            f.close()
