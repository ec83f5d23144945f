"""A worker's death charges only the entries it was running (issue 32, item 2), with real processes.

docs/failures.md: max_deliveries counts handler runs (and deaths mid-handler), never refusals. A worker
killed with a read of many entries must not charge a delivery to those only waiting for a thread, nor to
those whose handler had returned; the takeovers and the reclaim daemon then dead-letter only the entry
that keeps killing its worker.
"""
import signal
from collections import Counter

import pytest

from tests.entries import listed, publish_raw
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

FAST = {"PENDING_TIMEOUT_MS": 400, "CLAIM_INTERVAL_MS": 100, "RETRY_BACKOFF": 0.1, "CONSUMER_TTL": 2}


@pytest.mark.parametrize("threads", ["1", "4"])  # 4: neighbours run beside the killer, then it runs alone
def test_an_entry_that_kills_its_worker_is_the_only_one_dead_lettered(redis, run_consumer, threads):
    payloads = [{"n": n} for n in range(20)]
    payloads[0] = {"exit": True}
    ids = publish_raw(redis, "exits", payloads)
    redis.xgroup_create("exits", "g", id="0")
    supervisor = run_consumer("exits:g", "--workers", "1", "--threads", threads, streams=FAST)
    reclaimer = run_consumer("--interval", "0.1", streams=FAST, command="runreclaimer")
    wait_for(lambda: redis.xlen("{exits}:dlq") + len(set(listed(redis, "handled", "exits", "g"))) >= 20
             and redis.xpending("exits", "g")["pending"] == 0, timeout=90, what="each entry handled or dead-lettered")
    letters = [f for _, f in redis.xrange("{exits}:dlq")]
    assert [f["shoal:origin_id"] for f in letters] == [ids[0]], [(f["shoal:origin_id"], f["shoal:deliveries"]) for f in letters]
    assert letters[0]["shoal:deliveries"] == "3"
    started = Counter(listed(redis, "started", "exits", "g"))
    # Its first death, beside other entries' runs, is charged to nobody; then three runs alone, three
    # charged deaths: never a fifth.
    assert started[ids[0]] == 4
    assert sorted(set(listed(redis, "handled", "exits", "g"))) == sorted(ids[1:])
    for proc in (supervisor, reclaimer):
        proc.signal(signal.SIGTERM)
    assert [supervisor.wait(60), reclaimer.wait(60)] == [0, 0], supervisor.output() + reclaimer.output()


def test_a_kill_beside_other_runs_charges_nobody_and_the_runs_it_cut_run_again_alone(redis, run_consumer):
    # The trial after the ledger's redesign: with max_deliveries 1, entries running beside the one that
    # died (or recorded and not yet started, or returned and not yet off the record) were dead-lettered.
    # Which of two runs caused a death is not known: neither is charged; each runs again, alone.
    ids = publish_raw(redis, "slow", [{"n": n, "sleep": 2} for n in range(6)])
    redis.xgroup_create("slow", "once", id="0")
    first = run_consumer("slow:once", "--threads", "2", streams=FAST)
    wait_for(lambda: len(listed(redis, "started", "slow", "once")) == 2, timeout=30, what="two handlers running")
    # Two run, two more wait for a thread (a read takes twice the threads); kill -9 now.
    wait_for(lambda: redis.xpending("slow", "once")["pending"] == 4, timeout=10, what="four entries read")
    first.kill()
    running = set(listed(redis, "started", "slow", "once"))
    assert len(running) == 2
    second = run_consumer("slow:once", "--threads", "2", streams=FAST)
    wait_for(lambda: len(listed(redis, "handled", "slow", "once")) + redis.xlen("{slow}:dlq") == 6
             and redis.xpending("slow", "once")["pending"] == 0, timeout=60, what="every entry handled or dead-lettered")
    assert redis.xlen("{slow}:dlq") == 0  # max_deliveries=1, and nobody was charged the death
    assert sorted(listed(redis, "handled", "slow", "once")) == sorted(ids)
    second.signal(signal.SIGTERM)
    assert second.wait(60) == 0, second.output()


def test_without_count_handler_runs_a_kill_charges_every_entry_read(redis, run_consumer):
    # STREAMS["COUNT_HANDLER_RUNS"] = False trades the exact counts for throughput (docs/failures.md): Redis's
    # own counts then charge the kill to the two entries that were only waiting for a thread as well.
    streams = {**FAST, "COUNT_HANDLER_RUNS": False}
    publish_raw(redis, "slow", [{"n": n, "sleep": 2} for n in range(6)])
    redis.xgroup_create("slow", "once", id="0")
    first = run_consumer("slow:once", "--threads", "2", streams=streams)
    wait_for(lambda: len(listed(redis, "started", "slow", "once")) == 2, timeout=30, what="two handlers running")
    wait_for(lambda: redis.xpending("slow", "once")["pending"] == 4, timeout=10, what="four entries read")
    first.kill()
    running = set(listed(redis, "started", "slow", "once"))
    second = run_consumer("slow:once", "--threads", "2", streams=streams)
    wait_for(lambda: len(listed(redis, "handled", "slow", "once")) + redis.xlen("{slow}:dlq") == 6
             and redis.xpending("slow", "once")["pending"] == 0, timeout=60, what="every entry handled or dead-lettered")
    dead = {f["shoal:origin_id"] for _, f in redis.xrange("{slow}:dlq")}
    assert running < dead and len(dead) == 4  # the two running and the two that never ran
    second.signal(signal.SIGTERM)
    assert second.wait(60) == 0, second.output()


def _settle(redis, run_consumer, stream, count, *options):
    """Run ``stream``:g in one supervised worker beside the reclaim daemon until each of ``count`` entries is
    handled or dead-lettered; stop both. Returns the dead letters' (origin id, deliveries)."""
    supervisor = run_consumer(f"{stream}:g", "--workers", "1", *options, streams=FAST)
    reclaimer = run_consumer("--interval", "0.1", streams=FAST, command="runreclaimer")
    wait_for(lambda: redis.xlen(f"{{{stream}}}:dlq") + len(set(listed(redis, "handled", stream, "g"))) >= count
             and redis.xpending(stream, "g")["pending"] == 0, timeout=120, what="each entry handled or dead-lettered")
    for proc in (supervisor, reclaimer):
        proc.signal(signal.SIGTERM)
    assert [supervisor.wait(60), reclaimer.wait(60)] == [0, 0], supervisor.output() + reclaimer.output()
    return [(f["shoal:origin_id"], f["shoal:deliveries"]) for _, f in redis.xrange(f"{{{stream}}}:dlq")]


def test_an_async_handler_that_kills_its_worker_is_the_only_one_dead_lettered(redis, run_consumer):
    # F1 of the re-trial: with async def handlers every entry of the read was charged each death (10 of 10
    # dead-lettered at max_deliveries 3): suspects did not run alone on the event loop.
    payloads = [{"n": n, "sleep": 0.3} for n in range(10)]
    payloads[4] = {"exit": True}
    ids = publish_raw(redis, "aexits", payloads)
    redis.xgroup_create("aexits", "g", id="0")
    letters = _settle(redis, run_consumer, "aexits", 10, "--concurrency", "4")
    assert letters == [(ids[4], "3")]
    assert Counter(listed(redis, "started", "aexits", "g"))[ids[4]] == 4  # one uncharged death beside others
    assert sorted(set(listed(redis, "handled", "aexits", "g"))) == sorted(ids[:4] + ids[5:])


def test_async_neighbours_of_a_killer_are_never_charged_its_death(redis, run_consumer):
    # The trial after the ledger's redesign, at max_deliveries 1 with --concurrency 10: coroutines recorded
    # beside the killer and not yet started (26-29), and ones that had returned but were not yet off the
    # record (5-9 with the killer first), were dead-lettered; they were never charged a run of their own.
    payloads = [{"n": n} for n in range(50)]
    payloads[25] = {"exit": True}
    ids = publish_raw(redis, "aexitsonce", payloads)
    redis.xgroup_create("aexitsonce", "g", id="0")
    letters = _settle(redis, run_consumer, "aexitsonce", 50, "--concurrency", "10")
    assert letters == [(ids[25], "1")]
    assert Counter(listed(redis, "started", "aexitsonce", "g"))[ids[25]] == 2  # one free death, one charged alone
    assert sorted(set(listed(redis, "handled", "aexitsonce", "g"))) == sorted(ids[:25] + ids[26:])


def test_killers_read_together_are_each_dead_lettered_and_nothing_else(redis, run_consumer):
    # The re-trial of the "charged only alone" rule: four killers read together at max_deliveries 1 were never
    # dead-lettered (14 runs each and counting): the worker that took them over died of one of them before
    # running the others alone, and the next ran those in ordinary chunks, where a death is charged to nobody.
    # A suspect now stays one until it has run alone (the claim writes it into the taker's record).
    payloads = [{"n": n, "sleep": 0.05} for n in range(40)]
    for n in (10, 11, 12, 13):
        payloads[n] = {"exit": True}
    ids = publish_raw(redis, "exitsonce", payloads)
    redis.xgroup_create("exitsonce", "g", id="0")
    letters = _settle(redis, run_consumer, "exitsonce", 40, "--threads", "4")
    killers = [ids[n] for n in (10, 11, 12, 13)]
    assert sorted(letters) == sorted((k, "1") for k in killers)
    started = Counter(listed(redis, "started", "exitsonce", "g"))
    assert all(started[k] <= 2 for k in killers), {k: started[k] for k in killers}  # max_deliveries + 1
    assert sorted(set(listed(redis, "handled", "exitsonce", "g"))) == sorted(set(ids) - set(killers))


def test_a_death_in_a_chunk_of_several_charges_none_of_them(redis, run_consumer):
    # F2 and F3 of the re-trial: fast handlers run many entries per chunk; the killer's death charged its
    # whole chunk, entries that had returned before it and entries that never started, and with
    # max_deliveries 1 dead-lettered them all. Now nobody is charged for a death in a chunk of several;
    # each then runs alone, and the killer's next death is charged to it.
    payloads = [{"n": n} for n in range(300)]  # the first ones grow the chunks (loop._adapt_chunk)
    payloads[200] = {"exit": True}
    ids = publish_raw(redis, "exitsonce", payloads)
    redis.xgroup_create("exitsonce", "g", id="0")
    letters = _settle(redis, run_consumer, "exitsonce", 300, "--threads", "1")
    assert letters == [(ids[200], "1")]
    assert sorted(set(listed(redis, "handled", "exitsonce", "g"))) == sorted(ids[:200] + ids[201:])
    assert Counter(listed(redis, "started", "exitsonce", "g"))[ids[200]] == 2  # one free death, one charged alone


def test_a_suspect_runs_alone_after_the_acks_of_what_ran_beside_it(redis, run_consumer):
    # F4 of the re-trial: a taken-over suspect ran beside other handlers (which its death then charged), and
    # entries that had succeeded were not acked before it ran, so they ran again after each of its deaths.
    payloads = [{"n": n, "sleep": 0.2} for n in range(40)]
    payloads[0] = {"exit": True}
    ids = publish_raw(redis, "exitsalone", payloads)
    redis.xgroup_create("exitsalone", "g", id="0")
    letters = _settle(redis, run_consumer, "exitsalone", 40, "--threads", "4")
    assert letters == [(ids[0], "3")]
    events = [e.split() for e in redis.lrange("events:exitsalone", 0, -1)]
    killer_runs = [i for i, (kind, entry, _) in enumerate(events) if kind == "s" and entry == ids[0]]
    assert len(killer_runs) == 4  # one beside others (not charged), three alone
    for at in killer_runs[1:]:  # the runs as a suspect
        pid = events[at][2]
        here = [(kind, entry) for kind, entry, p in events if p == pid]
        before = [(kind, entry) for kind, entry, p in events[:at] if p == pid]
        started = Counter(entry for kind, entry in before if kind == "s")
        returned = Counter(entry for kind, entry in before if kind == "h")
        assert started == returned, f"running beside the suspect: {started - returned}"
        assert here[-1] == ("s", ids[0]), f"started after the suspect in its worker: {here[here.index(('s', ids[0])):]}"
        later = Counter(entry for kind, entry, _ in events[at:] if kind == "s")
        assert not set(returned) & set(later), f"succeeded before the suspect ran and ran again: {set(returned) & set(later)}"
    assert sorted(set(listed(redis, "handled", "exitsalone", "g"))) == sorted(ids[1:])
