"""The worker's event loop thread: bounded, observable for the heartbeat, cancellable, hard to kill."""
import asyncio
import threading

from streams_app.consuming.eventloop import EventLoopRunner
from tests.waiting import wait_for


def test_concurrency_is_bounded_and_progress_is_visible_to_the_heartbeat():
    clock = iter(range(1000)).__next__
    runner = EventLoopRunner(2, clock=lambda: float(clock()))
    release = threading.Event()
    running = []

    async def hold(n):
        running.append(n)
        await asyncio.to_thread(release.wait, 30)
        return n

    try:
        assert runner.progress_stamp(now=999.0) == 999.0  # idle: nothing can be stuck
        futures = [runner.submit(hold, n) for n in range(5)]
        wait_for(lambda: len(running) == 2, what="two coroutines running")
        assert runner.running == 2 and len(running) == 2  # the other three wait for a slot
        stamp = runner.progress_stamp(now=999.0)
        assert stamp == runner.last_activity < 999.0  # busy: the last start, not now
        release.set()
        assert sorted(f.result(timeout=30) for f in futures) == [0, 1, 2, 3, 4]
        assert runner.progress_stamp(now=999.0) == 999.0
    finally:
        assert runner.shutdown() == 0


def test_shutdown_cancels_what_still_runs_and_reports_what_ignored_it():
    runner = EventLoopRunner(10)
    started = threading.Event()

    async def forever():
        started.set()
        await asyncio.sleep(600)

    async def stubborn():
        while True:
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                continue  # ignores the cancel

    cancelled = runner.submit(forever)
    runner.submit(stubborn)
    started.wait(30)
    assert runner.shutdown(grace=0.5) == 1  # the stubborn one: the caller must not wait for it
    assert cancelled.cancelled()


def test_a_system_exit_from_a_task_the_handler_spawned_does_not_stop_the_loop():
    runner = EventLoopRunner(10)

    async def spawns():
        async def boom():
            raise SystemExit(3)  # asyncio re-raises this out of run_forever

        asyncio.get_running_loop().create_task(boom())
        await asyncio.sleep(0.05)
        return "after"

    async def later():
        return "still serving"

    try:
        runner.submit(spawns).result(timeout=30)
    except BaseException:
        pass  # the spawning coroutine may be cut short with the loop's first run
    assert runner.submit(later).result(timeout=30) == "still serving"
    assert runner.thread.is_alive()
    runner.shutdown()


def test_submit_many_settles_each_future_with_its_result_error_or_cancel():
    runner = EventLoopRunner(10)

    async def work(n):
        if n == 1:
            raise SystemExit(1)  # a BaseException travels to the read loop like any result
        if n == 2:
            await asyncio.sleep(600)
        return n

    futures = runner.submit_many(work, [(0,), (1,), (2,)])
    assert futures[0].result(timeout=30) == 0
    wait_for(lambda: futures[1].done(), what="the failing one done")
    assert isinstance(futures[1].exception(), SystemExit)
    assert runner.shutdown(grace=1) == 0
    wait_for(lambda: futures[2].done(), what="the cancelled one done")
    assert futures[2].cancelled()
