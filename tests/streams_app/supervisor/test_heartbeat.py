"""Heartbeat files and the progress the worker reports through them."""
import os
import threading

from streams_app.supervisor.heartbeat import Beater, HeartbeatFile, ProgressExecutor


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def test_file_reads_zero_until_the_first_beat_then_the_beat_time():
    hb = HeartbeatFile()
    try:
        assert hb.last_beat() == 0
        os.utime(hb.fd, (1234.5, 1234.5))
        assert hb.last_beat() == 1234.5
    finally:
        hb.close()


class FakeWorker:
    def __init__(self, executor):
        self.executor = executor


def test_beats_now_while_idle_and_the_last_progress_while_every_handler_is_stuck():
    clock = Clock(1000.0)
    executor = ProgressExecutor(1, clock=clock)
    hb = HeartbeatFile()
    beater = Beater(hb.fd, 5.0, clock=clock)
    release = threading.Event()
    try:
        beater(FakeWorker(executor))
        assert hb.last_beat() == 1000.0
        clock.now = 1010.0
        started = threading.Event()
        future = executor.submit(lambda: (started.set(), release.wait(30)))
        assert started.wait(10)
        clock.now = 1100.0
        beater(FakeWorker(executor))
        assert hb.last_beat() == 1010.0  # stuck since the handler started
        clock.now = 1102.0
        beater(FakeWorker(executor))
        assert hb.last_beat() == 1010.0  # within the interval: not even written
        release.set()
        future.result(10)
        clock.now = 1200.0
        beater(FakeWorker(executor))
        assert hb.last_beat() == 1200.0
    finally:
        release.set()
        executor.shutdown()
        hb.close()


def test_an_orphaned_worker_is_told_so():
    seen = []
    hb = HeartbeatFile()
    try:
        Beater(hb.fd, 5.0, master_pid=os.getppid(), on_orphaned=seen.append)(FakeWorker(None))
        assert seen == []
        orphan = FakeWorker(None)
        Beater(hb.fd, 5.0, master_pid=-1, on_orphaned=seen.append)(orphan)
        assert seen == [orphan]
    finally:
        hb.close()
