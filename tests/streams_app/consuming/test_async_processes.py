"""``async def`` handlers and handler shapes with real ``manage.py runconsumer`` processes.

An async handler has the guarantees of a sync one: acked only after it returns, retried and
dead-lettered when it raises, drained on SIGTERM, taken over after SIGKILL. Whatever a handler
raises (SystemExit and friends included) obeys max_deliveries without stopping the worker, and a
handler shape whose call runs nothing is refused or fails its entry, never acked.
"""
import json
import os
import signal
import textwrap
from collections import Counter

import pytest

from tests.entries import listed, publish_raw
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

FAST = {"PENDING_TIMEOUT_MS": 1500, "CLAIM_INTERVAL_MS": 300}


def pending_ids(client, stream, group):
    return {row["message_id"] for row in client.xpending_range(stream, group, "-", "+", 1000)}


def test_async_handler_writes_through_the_async_orm_once_per_message_and_is_acked_after(
        redis, run_consumer, process_database):
    db_env = {"DATABASE_URL": process_database.url}
    effects = "SELECT entry_id FROM testapp_effect"
    slow = publish_raw(redis, "aorm", [{"name": "slow", "sleep": 2.0}])[0]
    proc = run_consumer("aorm:g", "--concurrency", "20", streams=FAST, env=db_env)
    wait_for(lambda: listed(redis, "started", "aorm", "g") == [slow], timeout=60, what="the slow handler started")
    # Mid-await: the entry is delivered, unacked, and its effect not yet written.
    assert pending_ids(redis, "aorm", "g") == {slow}
    assert process_database.rows(effects) == []
    ids = publish_raw(redis, "aorm", [{"name": f"n{n}"} for n in range(200)])
    wait_for(lambda: len(listed(redis, "handled", "aorm", "g")) == 201 and not pending_ids(redis, "aorm", "g"),
             timeout=60, what="201 handled and acked")
    rows = process_database.rows(effects)
    assert sorted(r[0] for r in rows) == sorted([slow, *ids])  # every effect, exactly once
    assert Counter(listed(redis, "started", "aorm", "g")) == Counter([slow, *ids])
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()
    assert "20 concurrent async handlers" in proc.output()  # the flag was taken, not the default


def test_async_handler_that_raises_is_retried_then_dead_lettered(redis, run_consumer):
    [bad] = publish_raw(redis, "ajobs", [{"fail": "always"}])
    good = publish_raw(redis, "ajobs", [{"n": n} for n in range(20)])
    proc = run_consumer("ajobs:a")
    wait_for(lambda: redis.xlen("{ajobs}:dlq") == 1, timeout=60, what="the failing entry dead-lettered")
    [(_, fields)] = redis.xrange("{ajobs}:dlq")
    assert fields["shoal:origin_id"] == bad and fields["shoal:deliveries"] == "3"  # max_deliveries=3
    assert "RuntimeError: asked to fail: always" in fields["shoal:error"]
    assert "async def abehave" in fields["shoal:traceback"] or "abehave" in fields["shoal:traceback"]
    assert listed(redis, "started", "ajobs", "a").count(bad) == 3
    wait_for(lambda: not pending_ids(redis, "ajobs", "a"), timeout=30, what="nothing pending")
    assert sorted(listed(redis, "handled", "ajobs", "a")) == sorted(good)
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()


def test_sigterm_awaits_in_flight_coroutines_and_reads_nothing_more(redis, run_consumer):
    ids = publish_raw(redis, "ajobs", [{"n": n, "sleep": 1.5} for n in range(30)])
    proc = run_consumer("ajobs:a", "--concurrency", "50", "--block-ms", "5000")
    wait_for(lambda: len(listed(redis, "started", "ajobs", "a")) == 30, timeout=60, what="30 coroutines started")
    proc.signal(signal.SIGTERM)
    proc.wait_for_output("SIGTERM received")
    late = publish_raw(redis, "ajobs", [{"n": n} for n in range(3)])
    assert proc.wait(30) == 0, proc.output()
    assert sorted(listed(redis, "handled", "ajobs", "a")) == sorted(ids)
    assert not pending_ids(redis, "ajobs", "a")
    [group] = redis.xinfo_groups("ajobs")
    assert group["last-delivered-id"] == ids[-1] and group["lag"] == len(late)


def test_coroutines_still_running_at_the_shutdown_timeout_are_cancelled_and_stay_pending(redis, run_consumer):
    ids = publish_raw(redis, "ajobs", [{"n": n, "sleep": 600} for n in range(5)])
    proc = run_consumer("ajobs:a", "--shutdown-timeout", "1")
    wait_for(lambda: len(listed(redis, "started", "ajobs", "a")) == 5, timeout=60, what="5 coroutines started")
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()
    assert "cancelling 5 async handlers still running" in proc.output()
    assert pending_ids(redis, "ajobs", "a") == set(ids)  # not acked, ready for takeover
    assert listed(redis, "handled", "ajobs", "a") == []


def test_sigkill_mid_coroutine_is_taken_over_by_another_consumer(redis, run_consumer):
    ids = publish_raw(redis, "ajobs", [{"n": n, "sleep": 0.05} for n in range(400)])
    first = run_consumer("ajobs:a", "--concurrency", "10", streams=FAST)
    wait_for(lambda: len(listed(redis, "handled", "ajobs", "a")) >= 30, timeout=60, what="first consumer under way")
    first.kill()
    assert pending_ids(redis, "ajobs", "a"), "the killed consumer held no unacked entries"
    run_consumer("ajobs:a", "--concurrency", "50", streams=FAST)
    wait_for(lambda: set(listed(redis, "handled", "ajobs", "a")) == set(ids) and not pending_ids(redis, "ajobs", "a"),
             timeout=90, what="every entry handled and acked after takeover")


def test_async_handler_with_the_redis_guard_runs_a_key_once(redis, run_consumer):
    pipe = redis.pipeline(transaction=False)
    for n in range(40):
        pipe.xadd("aidem", {"payload": json.dumps({"n": n}), "key": f"k{n % 10}"})
    pipe.execute()
    proc = run_consumer("aidem:r", "--concurrency", "20")
    proc.wait_for_output("started (")
    wait_for(lambda: not pending_ids(redis, "aidem", "r") and redis.xinfo_groups("aidem")[0]["lag"] == 0,
             timeout=60, what="all 40 acked")
    handled = listed(redis, "handled", "aidem", "r")
    assert len(handled) == 10  # one per key; the 30 duplicates acked without running
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()


def test_sync_handler_returning_a_coroutine_fails_its_entry_and_is_dead_lettered(redis, run_consumer):
    [entry] = publish_raw(redis, "coro", [{"n": 1}])
    proc = run_consumer("coro:g")
    wait_for(lambda: redis.xlen("{coro}:dlq") == 1, timeout=60, what="the entry dead-lettered")
    [(_, fields)] = redis.xrange("{coro}:dlq")
    assert fields["shoal:origin_id"] == entry and fields["shoal:deliveries"] == "2"
    assert "HandlerShapeError" in fields["shoal:error"] and "returned an awaitable" in fields["shoal:error"]
    assert listed(redis, "started", "coro", "g") == []  # the coroutine's body never ran
    assert "was never awaited" not in proc.output()
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()


@pytest.mark.parametrize("stream", ["raises", "araises"])
def test_system_exit_keyboard_interrupt_and_generator_exit_obey_max_deliveries(redis, run_consumer, stream):
    """sync and async handlers alike: each is dead-lettered after 2 deliveries, the worker consumes on."""
    bad = publish_raw(redis, stream, [{"raise": kind} for kind in ("SystemExit", "KeyboardInterrupt", "GeneratorExit")])
    proc = run_consumer(f"{stream}:g", "jobs:a")
    wait_for(lambda: redis.xlen(f"{{{stream}}}:dlq") == 3, timeout=60, what="3 entries dead-lettered")
    letters = {f["shoal:origin_id"]: f for _, f in redis.xrange(f"{{{stream}}}:dlq")}
    assert set(letters) == set(bad)
    assert {f["shoal:deliveries"] for f in letters.values()} == {"2"}
    assert sorted(f["shoal:error"].split(":")[0] for f in letters.values()) == ["GeneratorExit", "KeyboardInterrupt",
                                                                          "SystemExit"]
    assert Counter(listed(redis, "started", stream, "g")) == {entry: 2 for entry in bad}  # never a third time
    # Still consuming, both groups.
    more = publish_raw(redis, stream, [{"n": 1}])
    jobs = publish_raw(redis, "jobs", [{"n": n} for n in range(5)])
    wait_for(lambda: listed(redis, "handled", stream, "g") == more and sorted(listed(redis, "handled", "jobs", "a")) == sorted(jobs),
             timeout=30, what="later entries handled")
    assert proc.proc.poll() is None
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()


def test_exception_whose_str_raises_is_dead_lettered_and_its_neighbours_acked(redis, run_consumer):
    payloads = [{"n": n} for n in range(10)]
    payloads.insert(5, {"raise": "BadStr"})
    ids = publish_raw(redis, "raises", payloads)
    bad = ids[5]
    proc = run_consumer("raises:g")
    wait_for(lambda: redis.xlen("{raises}:dlq") == 1, timeout=60, what="the entry dead-lettered")
    [(_, fields)] = redis.xrange("{raises}:dlq")
    assert fields["shoal:origin_id"] == bad and fields["shoal:deliveries"] == "2"
    assert fields["shoal:error"].startswith("BadStr (str() failed): BadStr()")
    wait_for(lambda: not pending_ids(redis, "raises", "g"), timeout=30, what="the neighbours acked")
    assert sorted(listed(redis, "handled", "raises", "g")) == sorted(i for i in ids if i != bad)
    assert proc.proc.poll() is None, proc.output()
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()
    assert "read loop" not in proc.output()  # it never crashed


# -- handler shapes refused at start-up ---------------------------------------------------------

@pytest.fixture
def shape_app(tmp_path):
    """Writes an installed app whose consumers.py declares the handler given."""
    package = tmp_path / "shapeapp"
    package.mkdir()
    (package / "__init__.py").write_text("")

    def write(source):
        (package / "consumers.py").write_text(textwrap.dedent(source))
        return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
                "SHOAL_TEST_APPS": json.dumps(["shapeapp"]), "PYTHONDONTWRITEBYTECODE": "1"}

    return write


@pytest.mark.parametrize("pool", [[], ["--workers", "1"]])
def test_a_generator_handler_is_refused_at_start_up(redis, run_consumer, shape_app, pool):
    env = shape_app("""\
        from streams_app import consumer

        @consumer("shapes", group="g")
        def handle(message):
            yield message.payload
    """)
    redis.xadd("shapes", {"payload": "{}"})
    proc = run_consumer("shapes:g", *pool, env=env)
    assert proc.wait(60) == 3, proc.output()
    assert "shapeapp.consumers.handle is a generator function" in proc.output()
    assert redis.xinfo_stream("shapes")["groups"] == 0  # nothing read, nothing acked


def test_an_unknown_consumer_option_is_refused_at_start_up_naming_the_closest(redis, run_consumer, shape_app):
    env = shape_app("""\
        from streams_app import consumer

        @consumer("shapes", group="g", max_delivery=1)
        def handle(message):
            pass
    """)
    proc = run_consumer("shapes:g", env=env)
    assert proc.wait(60) == 3, proc.output()
    assert "unknown option max_delivery=1; did you mean max_deliveries?" in proc.output()


def test_async_handlers_under_a_supervisor_are_handled_once_and_drained_on_sigterm(redis, run_consumer):
    ids = publish_raw(redis, "ajobs", [{"n": n, "sleep": 0.2} for n in range(300)])
    master = run_consumer("ajobs:a", "--workers", "2", "--concurrency", "30", streams=FAST)
    wait_for(lambda: len(listed(redis, "handled", "ajobs", "a")) >= 100, timeout=60, what="the workers under way")
    master.signal(signal.SIGTERM)
    assert master.wait(60) == 0, master.output()
    handled = listed(redis, "handled", "ajobs", "a")
    assert max(Counter(handled).values()) == 1  # each at most once, none twice
    assert set(handled) | pending_ids(redis, "ajobs", "a") <= set(ids)
    assert not pending_ids(redis, "ajobs", "a")  # the workers finished what they had started
    assert "30 concurrent async handlers" in master.output()


def test_a_worker_whose_coroutines_are_all_stuck_is_replaced_when_its_heartbeat_goes_stale(redis, run_consumer):
    """The liveness rule of sync handlers: no handler progress for the heartbeat timeout -> replaced."""
    [entry] = publish_raw(redis, "ajobs", [{"sleep": 3600}])
    master = run_consumer("ajobs:a", "--workers", "1", "--heartbeat-interval", "0.2", "--heartbeat-timeout", "3")
    wait_for(lambda: listed(redis, "started", "ajobs", "a") == [entry], timeout=60, what="the coroutine stuck")
    master.wait_for_output("no heartbeat for", timeout=30)
    wait_for(lambda: master.output().count("spawned worker") == 2, timeout=30, what="a replacement")
    master.signal(signal.SIGTERM)
    assert master.wait(30) == 0, master.output()
    assert pending_ids(redis, "ajobs", "a") == {entry}  # never acked: it is taken over, not lost


# -- trial findings (helpers/findings/trial-async.md) ---------------------------------------------

@pytest.mark.parametrize("stream", ["ablock", "ablockr"])  # ablockr: with idempotent="redis"
def test_handlers_that_returned_are_acked_while_another_coroutine_blocks_the_loop(redis, run_consumer, stream):
    [blocker] = publish_raw(redis, stream, [{"block": True}])
    fast = publish_raw(redis, stream, [*({"n": n} for n in range(4)), {"wake": True, "after": 4}])
    proc = run_consumer(f"{stream}:g", "--shutdown-timeout", "1")
    wait_for(lambda: listed(redis, "started", stream, "g") == [blocker], timeout=60, what="the loop blocked")
    # The five returned before the loop blocked: acked though the loop is not free.
    wait_for(lambda: pending_ids(redis, stream, "g") == {blocker}, timeout=30,
             what="the finished handlers acked while the loop is blocked")
    proc.signal(signal.SIGTERM)
    proc.wait(60)  # the blocked loop cannot unwind: the worker exits without it
    assert pending_ids(redis, stream, "g") == {blocker}, proc.output()
    assert sorted(listed(redis, "handled", stream, "g")) == sorted(fast)
    assert redis.xlen(f"{{{stream}}}:dlq") == 0
    if stream == "ablockr":
        return  # the takeover of the blocked entry itself meets the guard's "running" mark: another story
    # A second consumer runs only the blocked entry again, never the five that returned.
    redis.set(f"release:{stream}", "1")
    again = run_consumer(f"{stream}:g", streams={"PENDING_TIMEOUT_MS": 500, "CLAIM_INTERVAL_MS": 200})
    wait_for(lambda: not pending_ids(redis, stream, "g"), timeout=60, what="the blocked entry taken over")
    assert Counter(listed(redis, "handled", stream, "g")) == Counter([*fast, blocker])
    again.signal(signal.SIGTERM)
    assert again.wait(30) == 0, again.output()


def test_finished_handlers_are_acked_before_the_supervisor_kills_a_worker_whose_loop_is_blocked(redis, run_consumer):
    [blocker] = publish_raw(redis, "ablock", [{"block": True}])
    fast = publish_raw(redis, "ablock", [*({"n": n} for n in range(4)), {"wake": True, "after": 4}])
    proc = run_consumer("ablock:g", "--workers", "1", "--heartbeat-interval", "1", "--heartbeat-timeout", "4",
                        streams=FAST)
    proc.wait_for_output("no heartbeat", timeout=90)
    redis.set("release:ablock", "1")
    wait_for(lambda: not pending_ids(redis, "ablock", "g"), timeout=90, what="everything acked")
    assert Counter(listed(redis, "handled", "ablock", "g")) == Counter([*fast, blocker])
    assert redis.xlen("{ablock}:dlq") == 0
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.output()


def test_a_handler_that_cancels_its_own_task_fails_as_a_handler_failure(redis, run_consumer):
    [entry] = publish_raw(redis, "acancel", [{"n": 1}])
    proc = run_consumer("acancel:g")
    wait_for(lambda: redis.xlen("{acancel}:dlq") == 1, timeout=60, what="the entry dead-lettered")
    [(_, fields)] = redis.xrange("{acancel}:dlq")
    assert fields["shoal:origin_id"] == entry and fields["shoal:deliveries"] == "2"
    assert fields["shoal:error"].startswith("HandlerCancelledError: the handler's task was cancelled"), fields["shoal:error"]
    assert "cancels_its_own_task" in fields["shoal:traceback"]
    assert "failed outside its handler" not in proc.output()
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()


def test_an_async_handler_returning_an_awaitable_fails_with_a_message_saying_its_body_ran(redis, run_consumer):
    [entry] = publish_raw(redis, "aforgot", [{"n": 1}])
    proc = run_consumer("aforgot:g")
    wait_for(lambda: redis.xlen("{aforgot}:dlq") == 1, timeout=60, what="the entry dead-lettered")
    [(_, fields)] = redis.xrange("{aforgot}:dlq")
    assert "HandlerShapeError: the async handler ran, then returned an awaitable" in fields["shoal:error"], fields["shoal:error"]
    assert "missing await" in fields["shoal:error"] and "took it for a sync handler" not in fields["shoal:error"]
    assert listed(redis, "started", "aforgot", "g") == [entry, entry]  # the body ran on each delivery
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()


def test_tasks_a_handler_spawned_are_cancelled_at_shutdown_with_a_truthful_log(redis, run_consumer):
    ids = publish_raw(redis, "aspawn", [{"n": n} for n in range(3)])
    proc = run_consumer("aspawn:g")
    wait_for(lambda: len(listed(redis, "handled", "aspawn", "g")) == 3 and not pending_ids(redis, "aspawn", "g"),
             timeout=60, what="3 handled and acked")
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()
    assert "cancelling 3 tasks that async handlers started without awaiting them" in proc.output()
    assert "async handlers still running" not in proc.output()
    assert sorted(listed(redis, "handled", "aspawn", "g")) == sorted(ids)


BROKEN_CONSUMERS = {
    "import": ("from streams_app import consumer\nimport nosuchmodule_xyz\n",
               "importing shapeapp.consumers failed (", "ModuleNotFoundError: No module named 'nosuchmodule_xyz'"),
    "no group": ("from streams_app import consumer\n\n@consumer('o')\ndef handle(message):\n    pass\n",
                 "@consumer needs a stream and a group: @consumer('o', group='...')", ""),
    "bare": ("from streams_app import consumer\n\n@consumer\ndef handle(message):\n    pass\n",
             "above def handle, not a bare @consumer", ""),
    "nan backoff": ("from streams_app import consumer\n\n@consumer('o', group='g', retry_backoff=float('nan'))\n"
                    "def handle(message):\n    pass\n", "retry_backoff must be seconds", "finite"),
    "NUL group": ("from streams_app import consumer\n\n@consumer('o', group='a\\x00b')\ndef handle(message):\n    pass\n",
                  "group name 'a\\x00b' holds a control character", ""),
}


@pytest.mark.parametrize("case", sorted(BROKEN_CONSUMERS))
@pytest.mark.parametrize("command", [["runconsumer"], ["runreclaimer", "--once"], ["check"]])
def test_errors_in_a_consumers_module_exit_3_with_the_reason_and_no_traceback(run_consumer, shape_app, case, command):
    source, first, second = BROKEN_CONSUMERS[case]
    proc = run_consumer(*command[1:], env=shape_app(source), command=command[0])
    assert proc.wait(60) == 3, proc.output()
    out = proc.output()
    assert first in out and second in out, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize("flags", [
    ["--concurrency", "0"], ["--concurrency", "-1"], ["--concurrency", "abc"], ["--concurrency", "1.5"],
    ["--threads", "0"], ["--workers", "0"], ["--workers", "-2"], ["--batch", "0"], ["--block-ms", "0"],
    ["--min-workers", "0", "--max-workers", "2"], ["--shutdown-timeout", "nan"], ["--shutdown-timeout", "inf"],
    ["--shutdown-timeout", "-1"], ["--heartbeat-timeout", "inf", "--workers", "1"], ["--no-such-flag"],
])
def test_malformed_runconsumer_flags_exit_3_with_a_clear_message(run_consumer, flags):
    proc = run_consumer("jobs:a", *flags)
    assert proc.wait(60) == 3, proc.output()
    out = proc.output()
    assert "error" in out.lower() and flags[0] in out, out
    assert "Traceback" not in out and "usage:" not in out, out


@pytest.mark.parametrize("flags", [["--interval", "0"], ["--interval", "nan"], ["--interval", "inf"],
                                   ["--metrics-port", "x"]])
def test_malformed_runreclaimer_flags_exit_3_with_a_clear_message(run_consumer, flags):
    proc = run_consumer("--once", *flags, command="runreclaimer")
    assert proc.wait(60) == 3, proc.output()
    out = proc.output()
    assert "error" in out.lower() and flags[0] in out, out
    assert "Traceback" not in out and "usage:" not in out, out
