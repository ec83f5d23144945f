"""Periodic tasks (streams_app/tasks/periodic): schedule maths with an injected clock, the claim that
enqueues each tick once against a real Redis, the system checks, and two runconsumer supervisors of
which one is SIGKILLed half-way."""
import json
import signal
import sys
from datetime import UTC, datetime

import pytest
from django.core.checks import run_checks

from streams_app.tasks import results
from streams_app.tasks.periodic import entries, scheduler
from streams_app.tasks.periodic.schedule import Cron, Every, due, to_datetime, to_ms
from tests.waiting import wait_for


def ms(*args):
    return to_ms(datetime(*args, tzinfo=UTC))


def iso(ticks):
    return [to_datetime(tick).strftime("%Y-%m-%d %H:%M") for tick in ticks]


# -- schedule maths -------------------------------------------------------------------------

def test_every_ticks_at_the_multiples_of_its_seconds_since_the_epoch():
    every = Every(5)
    assert every.ticks(1_000, 21_000, 100) == [5_000, 10_000, 15_000, 20_000]
    assert every.ticks(5_000, 5_000, 100) == []  # after < tick <= until
    assert every.latest(21_000) == 20_000 and every.next_after(20_000) == 25_000
    assert every.describe() == "every 5 seconds" and Every(1).describe() == "every 1 second"
    assert Every(0.5).describe() == "every 0.5 seconds"


def test_cron_ticks_in_utc():
    cron = Cron("*/5 * * * *")
    assert iso(cron.ticks(ms(2026, 1, 1, 10, 0), ms(2026, 1, 1, 10, 16), 100)) == [
        "2026-01-01 10:05", "2026-01-01 10:10", "2026-01-01 10:15"]
    assert cron.latest(ms(2026, 1, 1, 10, 4)) == ms(2026, 1, 1, 10, 0)
    assert cron.describe() == "cron */5 * * * * (UTC)"


def test_cron_in_a_time_zone_ticks_at_its_wall_times():
    cron = Cron("0 9 * * *", "Europe/Paris")  # 09:00 in Paris: 08:00 UTC in winter, 07:00 in summer
    assert cron.next_after(ms(2026, 1, 10)) == ms(2026, 1, 10, 8, 0)
    assert cron.next_after(ms(2026, 7, 10)) == ms(2026, 7, 10, 7, 0)


def test_a_daily_tick_inside_the_spring_dst_gap_runs_once_at_the_end_of_the_gap():
    # Paris, 29 March 2026: 02:00 CET becomes 03:00 CEST (01:00 UTC); 02:30 does not exist that night.
    cron = Cron("30 2 * * *", "Europe/Paris")
    assert iso(cron.ticks(ms(2026, 3, 27), ms(2026, 3, 31), 100)) == [
        "2026-03-27 01:30", "2026-03-28 01:30", "2026-03-29 01:00", "2026-03-30 00:30"]


def test_ticks_of_the_gap_and_the_one_after_it_are_one_run():
    cron = Cron("*/30 * * * *", "Europe/Paris")  # 02:00 and 02:30 are skipped, 03:00 is the gap's end
    assert iso(cron.ticks(ms(2026, 3, 29, 0, 0), ms(2026, 3, 29, 2, 0), 100)) == [
        "2026-03-29 00:30", "2026-03-29 01:00", "2026-03-29 01:30", "2026-03-29 02:00"]


def test_a_daily_tick_in_the_autumn_repeated_hour_runs_once():
    # Paris, 25 October 2026: 03:00 CEST becomes 02:00 CET (01:00 UTC); 02:30 happens twice.
    cron = Cron("30 2 * * *", "Europe/Paris")
    assert iso(cron.ticks(ms(2026, 10, 23), ms(2026, 10, 27), 100)) == [
        "2026-10-23 00:30", "2026-10-24 00:30", "2026-10-25 00:30", "2026-10-26 01:30"]
    # Asked during the second 02:30 (01:30 UTC), the latest tick is the first one, and the next is tomorrow's.
    assert cron.latest(ms(2026, 10, 25, 1, 45)) == ms(2026, 10, 25, 0, 30)
    assert cron.next_after(ms(2026, 10, 25, 1, 29)) == ms(2026, 10, 26, 1, 30)


def test_a_cron_that_never_fires_has_no_next_tick():
    assert Cron("0 0 31 2 *").next_after(ms(2026, 1, 1)) is None
    assert Cron("0 0 31 2 *").latest(ms(2026, 1, 1)) is None


def test_a_bad_cron_expression_is_a_value_error():
    for expression in ("not cron", "*/5 * * *", "61 * * * *", "* * * * * *"):
        with pytest.raises(ValueError):
            Cron(expression)


EVERY_10 = Every(10)


def test_a_schedule_never_enqueued_runs_no_tick_from_before_its_scheduler_started():
    assert due(EVERY_10, None, 100_000, "all", 10_000, 100, since=95_000) == [100_000]
    assert due(EVERY_10, None, 100_000, "all", 30_000, 100, since=75_000) == [80_000, 90_000, 100_000]
    assert due(EVERY_10, None, 100_000, "all", 10_000, 100, since=100_000) == []


def test_ticks_late_by_up_to_late_after_all_run_whatever_catch_up_says():
    for mode in ("latest", "all", "none"):
        assert due(EVERY_10, 70_000, 100_000, mode, 30_000, 100) == [80_000, 90_000, 100_000]


def test_catch_up_latest_runs_the_newest_missed_tick_once():
    assert due(EVERY_10, 10_000, 100_000, "latest", 10_000, 100) == [90_000, 100_000]


def test_catch_up_all_runs_every_missed_tick_in_order_a_limited_number_per_pass():
    assert due(EVERY_10, 10_000, 100_000, "all", 10_000, 100) == list(range(20_000, 100_001, 10_000))
    assert due(EVERY_10, 10_000, 100_000, "all", 10_000, 3) == [20_000, 30_000, 40_000]


def test_catch_up_none_skips_the_missed_ticks():
    assert due(EVERY_10, 10_000, 100_000, "none", 10_000, 100) == [100_000]


# -- the claim, against a real Redis ----------------------------------------------------------

def entry(name="beat", **spec):
    return entries.build("default", name, {"task": "tests.testapp.tasks.add", "every": 1, "args": [1, 2], **spec})


def stream_ids(redis, stream="tasks:default"):
    return [json.loads(fields["payload"])["id"] for _, fields in redis.xrange(stream)]


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


@pytest.mark.both_redis
def test_two_schedulers_on_one_redis_enqueue_each_tick_once(jobs, redis):
    clock = Clock(1_000_000.0)
    first, second = (scheduler.Scheduler([entry()], clock=clock) for _ in range(2))
    enqueued = 0
    for step in range(20):
        clock.now += 0.5  # both look twice per tick, in either order
        pair = (first, second) if step % 3 else (second, first)
        enqueued += sum(one.tick() for one in pair)
    ticks = list(range(1_000_000_000 + 1000, int(clock.now * 1000) + 1, 1000))
    assert enqueued == len(ticks) == 10
    ids = stream_ids(redis)
    assert sorted(ids) == sorted(scheduler.result_id(entry(), tick) for tick in ticks)  # each once, none missing
    for tick in ticks:
        record = results.get(redis, scheduler.result_id(entry(), tick))
        assert record["status"] == "READY" and record["task"] == "tests.testapp.tasks.add"
        assert record["run_after"] == to_datetime(tick) and record["args"] == [1, 2]
        assert jobs.add.get_result(record["id"]).task.run_after == to_datetime(tick)
    assert scheduler.last_tick(redis, entry()) == ticks[-1]
    listed = results.ids(redis, "default", 100)
    assert set(listed) == set(ids)  # the Tasks page lists them


def test_a_tick_claimed_once_is_not_enqueued_again(jobs, redis):
    beat = entry()
    assert scheduler.enqueue_tick(redis, beat, 5_000_000) is True
    assert scheduler.enqueue_tick(redis, beat, 5_000_000) is False
    assert scheduler.enqueue_tick(redis, beat, 4_000_000) is False  # older than the newest: not enqueued
    assert len(stream_ids(redis)) == 1


def test_a_tick_not_come_yet_on_the_redis_clock_is_not_enqueued_early(jobs, redis):
    seconds, micros = redis.time()
    ahead = (seconds + 30) * 1000  # this host's clock 30 s ahead of Redis's
    assert scheduler.enqueue_tick(redis, entry(), ahead) is None
    assert stream_ids(redis) == [] and scheduler.last_tick(redis, entry()) is None
    clock = Clock(seconds + 30.0)
    one = scheduler.Scheduler([entry()], clock=Clock(seconds + 29.0))
    one.clock = clock
    assert one.tick() == 0 and one.next_at["default", "beat"] == int(clock.now * 1000)  # tried again next pass


def test_a_scheduler_that_died_before_its_claim_leaves_the_tick_to_the_next(jobs, redis):
    clock = Clock(1_999_999.5)
    first = scheduler.Scheduler([entry()], clock=clock)
    clock.now += 0.5
    assert first.tick() == 1  # tick 2_000_000 s
    clock.now += 4  # first is gone (SIGKILL) before these ticks; another supervisor starts 4 s later
    second = scheduler.Scheduler([entry()], clock=clock)
    assert second.tick() == 4
    assert sorted(stream_ids(redis)) == sorted(scheduler.result_id(entry(), t * 1000)
                                               for t in range(2_000_000, 2_000_005))


def test_after_a_long_stop_catch_up_latest_runs_the_newest_missed_tick_then_the_ticks_on_time(jobs, redis):
    beat = entry(every=60)
    clock = Clock(3_000_000.0 - 3_000_000 % 60 - 1)
    first = scheduler.Scheduler([beat], clock=clock)
    clock.now += 1
    assert first.tick() == 1
    clock.now += 3600  # an hour with nothing running: 59 ticks missed, the 60th due now
    assert scheduler.Scheduler([beat], clock=clock).tick() == 2  # the newest missed, and the one due now
    assert sorted(stream_ids(redis)) == sorted(scheduler.result_id(beat, int(t) * 1000)
                                               for t in (clock.now - 3600, clock.now - 60, clock.now))
    clock.now += 3600 + 30  # the newest missed is 30 s late (older than LATE_AFTER); none due now
    assert scheduler.Scheduler([beat], clock=clock).tick() == 1
    assert scheduler.last_tick(redis, beat) == int(clock.now - 30) * 1000


def test_a_scheduler_reads_redis_only_when_a_tick_is_due(jobs, redis):
    clock = Clock(4_000_000.0)
    one = scheduler.Scheduler([entry(every=10)], clock=clock)
    one.tick()
    assert one.next_at["default", "beat"] == 4_000_010_000
    clock.now += 5
    assert one.tick() == 0


def test_a_task_whose_module_fails_to_import_is_logged_and_tried_later_the_rest_go_on(jobs, redis, caplog):
    clock = Clock(4_999_999.0)
    broken = entries.build("default", "broken", {"task": "tests.testapp.periodic_broken.job", "every": 1})
    one = scheduler.Scheduler([broken, entry()], clock=clock)
    clock.now += 1
    assert one.tick() == 1
    assert "Periodic broken: cannot enqueue tests.testapp.periodic_broken.job" in caplog.text
    assert one.next_at["default", "broken"] == 5_000_000_000 + scheduler.RETRY_AFTER * 1000


def test_run_now_enqueues_one_more_run_with_a_new_id_and_keeps_the_ticks(jobs, redis):
    beat = entry()
    scheduler.enqueue_tick(redis, beat, 6_000_000)
    result = scheduler.run_now(beat)
    assert jobs.add.get_result(result.id).status == "READY" and result.args == [1, 2]
    state = scheduler.status(redis, beat)
    assert state == {"tick": 6_000_000, "id": scheduler.result_id(beat, 6_000_000), "manual_id": result.id,
                     "manual_at": state["manual_at"]}
    assert len(stream_ids(redis)) == 2


def test_entries_take_the_queue_and_priority_given(jobs, redis):
    beat = entry(queue_name="emails", priority=10)
    scheduler.enqueue_tick(redis, beat, 7_000_000)
    assert len(stream_ids(redis, "tasks:emails:high")) == 1
    record = results.get(redis, scheduler.result_id(beat, 7_000_000))
    assert record["queue"] == "emails" and record["priority"] == 10


def test_an_async_task_s_runs_go_to_the_queue_s_async_stream(jobs, redis):
    beat = entry(task="tests.testapp.tasks.async_add")
    assert scheduler.enqueue_tick(redis, beat, 8_000_000) is True
    assert len(stream_ids(redis, "tasks:default:async")) == 1 and stream_ids(redis) == []
    assert scheduler.last_tick(redis, beat) == 8_000_000


def test_runconsumer_schedules_only_the_entries_of_the_queues_it_runs(settings, jobs):
    from streams_app.registry import select
    from streams_app.tasks import setup

    settings.TASKS = {"default": {**settings.TASKS["default"], "OPTIONS": {"PERIODIC": {
        "beat": {"task": "tests.testapp.tasks.add", "every": 5, "args": [1, 2]},
        "mail": {"task": "tests.testapp.tasks.send_email", "cron": "*/5 * * * *", "args": ["a@example.com"]},
    }}}}
    setup.install()
    assert [e.name for e in scheduler.for_specs(select(["tasks:emails:workers"])).entries] == ["mail"]
    assert sorted(e.name for e in scheduler.for_specs(select([])).entries) == ["beat", "mail"]
    assert scheduler.for_specs([spec for spec in select([]) if not spec.stream.startswith("tasks:")]) is None


# -- the system checks ------------------------------------------------------------------------

def periodic_errors(settings, table, **backend):
    settings.TASKS = {"default": {"BACKEND": "streams_app.tasks.StreamsBackend", "QUEUES": ["default", "emails"],
                                  "OPTIONS": {"PERIODIC": table}, **backend}}
    return [(error.id, error.msg, error.hint) for error in run_checks(databases=[])
            if error.id.startswith("streams_app.E06") and error.id >= "streams_app.E064"]


def test_checks_accept_good_entries(settings, jobs):
    assert periodic_errors(settings, {
        "beat": {"task": "tests.testapp.tasks.add", "every": 5, "args": [1, 2]},
        "nightly": {"task": "tests.testapp.tasks.add", "cron": "30 2 * * *", "timezone": "Europe/Paris",
                    "kwargs": {"a": 1, "b": 2}, "catch_up": "all", "queue_name": "emails", "priority": -5},
    }) == []


@pytest.mark.parametrize("spec, check, words", [
    ({"cron": "every five minutes"}, "E065", "cron"),
    ({"cron": "*/5 * * *"}, "E065", "five fields"),
    ({"cron": "0 0 31 2 *"}, "E065", "never fires"),
    ({"task": "tests.testapp.tasks.no_such_task", "every": 5}, "E066", "nothing, not a Django Task"),
    ({"task": "tests.testapp.periodic_broken.job", "every": 5}, "E066", "RuntimeError: this module is broken"),
    ({"task": "nowhere.tasks.job", "every": 5}, "E066", "not in an imported module or an installed app"),
    ({"task": "tests.testapp.tasks.add", "every": 5, "cron": "* * * * *"}, "E064", "not both"),
    ({"task": "tests.testapp.tasks.add"}, "E064", "not neither"),
    ({"every": 0}, "E064", "1 or more, not 0"),
    ({"every": -1}, "E064", "1 or more, not -1"),
    ({"every": 0.001}, "E064", "1 or more, not 0.001"),
    ({"every": 5, "when": "often"}, "E064", "unknown key 'when'"),
    ({"every": 5, "catch_up": "some"}, "E064", "catch_up"),
    ({"every": 5, "args": "1, 2"}, "E064", "\"args\" must be a list"),
    ({"every": 5, "args": [float("nan")]}, "E064", "must be JSON"),
    ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "E067", "'Mars/Olympus' is not a time zone"),
    ({"every": 5, "queue_name": "nope"}, "E068", "'nope' is not a queue of TASKS['default']"),
    ({"every": 5, "priority": 500}, "E064", "priority"),
])
def test_checks_name_each_bad_entry(settings, jobs, spec, check, words):
    spec = {"task": "tests.testapp.tasks.add", **spec}
    found = periodic_errors(settings, {"beat": spec})
    assert [error[0] for error in found] == [f"streams_app.{check}"], found
    assert "TASKS['default']['OPTIONS']['PERIODIC']['beat']" in found[0][1] and words in found[0][1], found


def test_checks_say_periodic_must_be_a_dict(settings, jobs):
    [(check, message, _)] = periodic_errors(settings, [{"every": 5}])
    assert check == "streams_app.E064" and "must be a dict" in message


def test_a_cron_entry_without_croniter_installed_says_how_to_install_it(settings, jobs, monkeypatch):
    monkeypatch.setitem(sys.modules, "croniter", None)  # import croniter raises ImportError
    [(check, message, hint)] = periodic_errors(settings, {"beat": {"task": "tests.testapp.tasks.add",
                                                                   "cron": "* * * * *"}})
    assert check == "streams_app.E065" and "croniter, which is not installed" in message
    assert "django-shoal[periodic]" in hint
    assert periodic_errors(settings, {"beat": {"task": "tests.testapp.tasks.add", "every": 5}}) == []


# -- two supervisors, one SIGKILLed half-way -----------------------------------------------------

@pytest.mark.slow
@pytest.mark.both_redis  # on a cluster the result is written after the claim script, in its own slot
def test_two_supervisors_enqueue_each_tick_once_while_one_is_sigkilled(jobs, run_workers, redis):
    options = {"PERIODIC": {"beat": {"task": "tests.testapp.tasks.add", "every": 1, "args": [2, 3]}}}
    streams = {"PENDING_TIMEOUT_MS": 1500, "CLAIM_INTERVAL_MS": 300}
    first = run_workers("tasks:default:workers", "--workers", "1", options=options, streams=streams)
    second = run_workers("tasks:default:workers", "--workers", "1", options=options, streams=streams)

    def runs():
        return stream_ids(redis)

    wait_for(lambda: len(runs()) >= 4, timeout=30, what="four ticks enqueued")
    # The one that enqueued the latest tick goes (each pass of the other may find its ticks taken).
    latest = runs()[-1]
    victim = wait_for(lambda: next((proc for proc in (first, second) if latest in proc.output()), None),
                      timeout=10, what="the log line of the latest tick")
    survivor = second if victim is first else first
    said = "Periodic beat: enqueued"
    victim.signal(signal.SIGKILL)
    victim.proc.wait(timeout=10)
    killed_at = len(runs())
    wait_for(lambda: len(runs()) >= killed_at + 4, timeout=30, what="four more ticks after the SIGKILL")
    survivor.signal(signal.SIGTERM)
    survivor.wait(timeout=60)
    assert said in survivor.output()
    assert "Supervisor: schedules 1 periodic task: beat (every 1 second)" in survivor.output()
    ids = runs()
    assert len(ids) == len(set(ids)), "a tick was enqueued twice"
    records = [record for record in results.many(redis, ids) if record is not None]
    assert len(records) == len(ids)
    ticks = sorted(to_ms(record["run_after"]) for record in records)
    assert ticks == list(range(ticks[0], ticks[-1] + 1, 1000)), "a tick is missing between the first and the last"
    assert all(record["id"] == scheduler.result_id(entry(), to_ms(record["run_after"])) for record in records)
    done = [record for record in records if record["status"] == "SUCCESSFUL"]
    assert done and all(jobs.add.get_result(record["id"]).return_value == 5 for record in done)


@pytest.mark.slow
def test_runconsumer_without_a_supervisor_schedules_too_and_runs_the_ticks(jobs, run_workers, redis):
    options = {"PERIODIC": {"beat": {"task": "tests.testapp.tasks.add", "every": 1, "args": [2, 3]}}}
    proc = run_workers("tasks:default:workers", options=options)
    wait_for(lambda: len(stream_ids(redis)) >= 2, timeout=30, what="two ticks enqueued")
    first = stream_ids(redis)[0]
    done = wait_for(lambda: jobs.add.get_result(first).is_finished and jobs.add.get_result(first), timeout=30,
                    what="the first run finished")
    assert done.status == "SUCCESSFUL" and done.return_value == 5
    assert "Periodic beat: enqueued" in proc.output()
    assert "schedules 1 periodic task: beat (every 1 second)" in proc.output()


def test_while_redis_does_not_answer_the_scheduler_asks_again_only_every_few_seconds(jobs, redis_factory):
    # A supervisor's loop runs a pass every second; each attempt against a Redis that is gone can block it
    # for the connection's timeout, so the scheduler waits OUTAGE_RETRY_MS between attempts.
    import redis as redis_py

    server = redis_factory()
    port = server.port
    server.stop()
    asked = []

    def connection():
        asked.append(1)
        return redis_py.Redis(port=port, socket_connect_timeout=0.5)

    clock = Clock(1_000_000.0)
    one = scheduler.Scheduler([entry()], clock=clock, connection=connection)
    for _ in range(4):  # four passes a second apart
        clock.now += 1.0
        assert one.tick() == 0
    assert len(asked) == 1 and one.failing
    clock.now += scheduler.OUTAGE_RETRY_MS / 1000
    one.tick()
    assert len(asked) == 2


def test_a_name_with_a_slash_is_refused_by_the_checks(settings, jobs):
    # The trial: "reports/daily" passed the checks, then the Schedules page answered 500 (its Run now address).
    found = periodic_errors(settings, {"reports/daily": {"task": "tests.testapp.tasks.add", "every": 60}})
    assert [error[0] for error in found] == ["streams_app.E064"] and "'/'" in found[0][1], found


def test_the_task_sees_its_tick_as_run_after_in_its_context(jobs, redis):
    # The trial: result.task.run_after was the tick, yet context.task_result.task.run_after was None.
    from streams_app.tasks.backend import to_task_result

    clock = Clock(1_000_000.0)
    one = scheduler.Scheduler([entry()], clock=clock)
    clock.now += 1.5
    assert one.tick() == 1
    [result_id] = stream_ids(redis)
    record = results.get(redis, result_id)
    assert record["run_after"] is not None
    assert to_task_result(record, jobs.add).task.run_after == record["run_after"]


@pytest.mark.both_redis
def test_a_tick_whose_result_was_never_written_runs_with_its_tick_as_run_after(jobs, redis):
    # CI on a cluster: the result is written after the claim script, so a scheduler SIGKILLed in between
    # (or a worker quicker than it) left the worker writing the result from the message: run_after None.
    from streams_app.publishing.message import Message
    from streams_app.tasks.runner import run_message

    clock = Clock(1_000_000.0)
    one = scheduler.Scheduler([entry()], clock=clock)
    clock.now += 1.5
    assert one.tick() == 1
    [result_id] = stream_ids(redis)
    tick = results.get(redis, result_id)["run_after"]
    redis.delete(results.key(result_id))
    [(entry_id, fields)] = redis.xrange("tasks:default")
    run_message("default", Message(entry_id, "tasks:default", "workers", fields, deliveries=1, consumer="w-1"))
    record = results.get(redis, result_id)
    assert record["status"] == "SUCCESSFUL" and record["run_after"] == tick and record["enqueued_at"] is not None
