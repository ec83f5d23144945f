"""manage.py repartition / streams_app.operations.repartition: the live layout, its phases, resuming, the lock, deferred messages."""
import json
import threading
import time
import zlib
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from streams_app import publish, publish_many
from streams_app.partitioning import drain, layout, partitions
from streams_app.redis.connection import get_connection
from streams_app.redis.keys import scheduled_key
from streams_app.operations.repartition import RepartitionError, lock_key, repartition
from tests.waiting import wait_for

pytestmark = pytest.mark.both_redis


@pytest.fixture
def invoices(settings, redis, monkeypatch):
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"invoices": 4}}
    monkeypatch.setattr(layout, "SWITCH_SECONDS", 0.3)  # this process is the only publisher here
    return partitions.names("invoices")


def test_feeders_of_a_new_partition_follow_the_gcd_of_the_counts():
    def feeders(old, new):
        live = layout.Layout("s", {"epoch": 1, "state": layout.SEALED, "previous": [f"o{i}" for i in range(old)],
                                   "names": [f"n{j}" for j in range(new)]})
        return {j: [int(p[1:]) for p in live.feeders(f"n{j}")] for j in range(new)}

    assert feeders(4, 8) == {j: [j % 4] for j in range(8)}  # a multiple: exactly one feeder each
    assert feeders(8, 4) == {j: [j, j + 4] for j in range(4)}
    assert feeders(4, 6) == {j: [i for i in range(4) if i % 2 == j % 2] for j in range(6)}
    # What the gcd rule claims: every key's old partition is among the feeders of its new one.
    for key in (f"k{n}" for n in range(500)):
        crc = zlib.crc32(key.encode())
        assert crc % 4 in feeders(4, 6)[crc % 6]


def test_growing_prints_its_phases_and_publishers_follow_the_live_layout(invoices, redis):
    old = list(invoices)
    publish_many("invoices", [{"n": n} for n in range(40)], keys=[f"k{n}" for n in range(40)])
    said = []
    final = repartition("invoices", 8, say=said.append)
    text = "\n".join(said)
    for phase in ("prepare:", "switch:", "seal:", "drain:", "retire: done, 8 partitions"):
        assert phase in text, text
    new = partitions.names("invoices")
    assert new == final.names and len(new) == 8 and not set(new) & set(old)
    assert partitions.reading("invoices") == new and set(partitions.every_name("invoices")) == set(old + new)
    # Keys route over the new names, by CRC-32 modulo 8.
    ids = publish_many("invoices", [{"n": n} for n in range(40)], keys=[f"k{n}" for n in range(40)])
    for n, entry_id in enumerate(ids):
        index = zlib.crc32(f"k{n}".encode()) % 8
        assert redis.xrange(new[index], min=entry_id, max=entry_id)
    assert sum(redis.xlen(name) for name in old) == 40  # the previous partitions got nothing more
    assert partitions.logical(new[5]) == ("invoices", 5) and partitions.logical(old[1]) == ("invoices", 1)
    # Run again: nothing to do.
    assert "already 8 partitions" in "".join(_run("invoices", 8))


def _run(stream, n):
    said = []
    repartition(stream, n, say=said.append)
    return said


def test_shrinking_and_the_command_line(invoices, redis, capsys):
    repartition("invoices", 8, say=lambda text: None)
    call_command("repartition", "invoices", "3")
    out = capsys.readouterr().out
    assert "8 -> 3 partitions (epoch 2)" in out and "retire: done, 3 partitions (epoch 2)" in out
    assert len(partitions.names("invoices")) == 3 and all(":e2." in name for name in partitions.names("invoices"))
    with pytest.raises(CommandError, match="integer from 2 to 1024"):
        call_command("repartition", "invoices", "1")


def test_drain_waits_until_every_group_handled_the_previous_partitions(invoices, redis):
    conn = get_connection()
    for name in invoices:
        conn.xgroup_create(name, "g", id="0", mkstream=True)
    publish_many("invoices", [{"n": n} for n in range(20)], keys=[f"k{n}" for n in range(20)])
    said, done = [], threading.Event()
    thread = threading.Thread(target=lambda: (repartition("invoices", 8, say=said.append), done.set()), daemon=True)
    thread.start()
    wait_for(lambda: any("entries left" in line for line in said), timeout=30, what="the drain to report")
    assert "(20 entries" not in said[-1] and "20 entries left" in said[-1], said
    # The group on every new partition was made at 0, before publishers switched: nothing skipped.
    assert all(drain.groups(conn, name) == ["g"] for name in partitions.names("invoices"))
    assert not done.is_set()
    for name in invoices:  # a consumer handles everything
        for _, entries in conn.xreadgroup("g", "c", {name: ">"}) or []:
            conn.xack(name, "g", *[entry_id for entry_id, _ in entries])
    wait_for(done.is_set, timeout=30, what="the repartition to finish")
    assert "drained" in "\n".join(said)


def test_two_at_once_one_refuses_with_a_clear_message(invoices, redis):
    redis.set(lock_key("invoices"), "host:123:abcd", px=10_000)
    with pytest.raises(CommandError, match="another repartition of this stream is running .*host:123:abcd"):
        call_command("repartition", "invoices", "8")
    assert partitions.names("invoices") == invoices  # nothing changed


def test_stopped_part_way_running_again_finishes_and_another_count_is_refused_meanwhile(invoices, redis):
    conn = get_connection()
    for name in invoices:
        conn.xgroup_create(name, "g", id="0", mkstream=True)
    publish("invoices", {"n": 1}, key="a")
    sealed = repartition("invoices", 8, say=lambda text: None, wait=False)  # as if killed in the drain
    assert sealed.state == layout.SEALED and not redis.exists(lock_key("invoices"))
    assert len(partitions.names("invoices")) == 8 and len(partitions.reading("invoices")) == 12
    with pytest.raises(RepartitionError, match="being repartitioned from 4 to 8 .*finish that first"):
        repartition("invoices", 6, say=lambda text: None)
    for name in invoices:
        for _, entries in conn.xreadgroup("g", "c", {name: ">"}) or []:
            conn.xack(name, "g", *[entry_id for entry_id, _ in entries])
    said = _run("invoices", 8)
    assert "resuming the change from 4 to 8" in said[0] and "retire: done" in said[-1]
    assert partitions.reading("invoices") == partitions.names("invoices")


def test_deferred_messages_move_to_the_partition_their_key_routes_to_now(invoices, redis):
    for n in range(12):
        publish("invoices", {"n": n}, key=f"k{n}", run_after=timedelta(hours=1))
    assert sum(redis.zcard(scheduled_key(name)) for name in invoices) == 12
    said = _run("invoices", 8)
    assert any("deferred: moved 12" in line for line in said), said
    new = partitions.names("invoices")
    assert sum(redis.zcard(scheduled_key(name)) for name in invoices) == 0
    for n in range(12):
        assert redis.zcard(scheduled_key(new[zlib.crc32(f"k{n}".encode()) % 8])) >= 1


def test_a_system_check_warns_while_the_setting_names_another_count(invoices, redis, settings):
    from streams_app.checks import check_live_partitions

    assert check_live_partitions() == []
    repartition("invoices", 8, say=lambda text: None)
    warnings = check_live_partitions()
    assert [w.id for w in warnings] == ["streams_app.W031"]
    assert "STREAMS['PARTITIONS']['invoices'] is 4" in warnings[0].msg and "'invoices': 8}" in warnings[0].hint
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"invoices": 8}}
    assert check_live_partitions() == []


def test_dead_letters_follow_to_the_live_partitions_and_replay_finds_them(invoices, redis):
    from streams_app.deadletters.replay import replay
    from streams_app.redis.keys import dead_letter_key

    conn = get_connection()
    for name in invoices:
        conn.xgroup_create(name, "g", id="0", mkstream=True)
    for n in range(6):  # as the dead-letter script writes them: the entry's fields and shoal:* ones
        old = partitions.route("invoices", f"k{n}")
        conn.xadd(dead_letter_key(old), {"payload": json.dumps({"n": n}), "key": f"k{n}", "shoal:origin_stream": old,
                                          "shoal:origin_id": f"1-{n}", "shoal:group": "g"})
    said = _run("invoices", 8)
    assert any("dead letters: moved 6" in line for line in said), said
    new = partitions.names("invoices")
    assert sum(redis.xlen(dead_letter_key(name)) for name in invoices) == 0
    for n in range(6):
        target = new[zlib.crc32(f"k{n}".encode()) % 8]
        assert any(f["key"] == f"k{n}" for _, f in redis.xrange(dead_letter_key(target)))
    result = replay("invoices", "g", all=True)
    assert len(result.replayed) == 6
    for n in range(6):
        target = new[zlib.crc32(f"k{n}".encode()) % 8]
        assert any(f.get("key") == f"k{n}" for _, f in redis.xrange(target))


@pytest.mark.django_db
def test_the_reclaimer_and_the_lag_follow_the_live_layout(invoices, redis, settings):
    from streams_app.redis.lag import read_lags
    from streams_app.operations.reclaim import Reclaimer
    from streams_app.registry import select

    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"ordered": 4}}
    reclaimer = Reclaimer()
    before = {spec.stream for spec in reclaimer.specs if spec.logical == "ordered"}
    repartition("ordered", 6, say=lambda text: None)
    reclaimer.tick()
    after = {spec.stream for spec in reclaimer.specs if spec.logical == "ordered"}
    assert len(before) == 4 and after == set(partitions.names("ordered")) and len(after) == 6
    specs = [spec for spec in select(["ordered:o"])]
    assert {lag.stream for lag in read_lags(get_connection(), specs)} == after


def test_a_plain_stream_becomes_partitioned_and_its_ordered_feeder_is_the_plain_stream(redis, monkeypatch):
    monkeypatch.setattr(layout, "SWITCH_SECONDS", 0.3)
    publish("receipts", {"n": 0}, key="a")
    assert partitions.names("receipts") == ["receipts"]
    sealed = repartition("receipts", 3, say=lambda text: None, wait=False)
    assert sealed.previous == ["receipts"] and all(sealed.feeders(name) == ["receipts"] for name in sealed.names)
    entry = publish("receipts", {"n": 1}, key="a")
    assert redis.xrange(partitions.names("receipts")[zlib.crc32(b"a") % 3], min=entry, max=entry)
    said = _run("receipts", 3)  # no group reads the plain stream: said, and retired
    assert any("no group reads receipts" in line for line in said), said
    assert partitions.reading("receipts") == partitions.names("receipts") and partitions.is_partitioned("receipts")


def test_redis_away_the_last_known_layout_stands(redis_factory, use_redis, settings, monkeypatch):
    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"invoices": 4}}
    monkeypatch.setattr(layout, "SWITCH_SECONDS", 0.3)
    server = redis_factory()
    use_redis(server)
    live = repartition("invoices", 8, say=lambda text: None).names
    assert partitions.names("invoices") == live
    server.stop()
    clock = [layout.REFRESH_SECONDS * 10 + 1e6]  # long after the last read: a refresh is due, and fails
    started = time.monotonic()
    assert layout.current("invoices", clock=lambda: clock[0]).names == live
    assert partitions.names("invoices") == live
    assert time.monotonic() - started < 2  # one failed try, then none for REFRESH_SECONDS


def test_the_backlog_metrics_follow_the_layout_with_each_partition_indexed_in_its_epoch(redis, settings, monkeypatch):
    from streams_app.metrics.consumer import BacklogCollector

    settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"ordered": 2}}
    monkeypatch.setattr(layout, "SWITCH_SECONDS", 0.3)
    old = partitions.names("ordered")
    publish_many("ordered", [{"key": "a", "n": n} for n in range(3)], keys=["a"] * 3)  # unread: the drain waits
    repartition("ordered", 4, say=lambda text: None, wait=False)
    new = partitions.names("ordered")

    def labelled():
        [backlog] = [m for m in BacklogCollector().collect() if m.name == "shoal_group_backlog"]
        return {s.labels["stream"]: s.labels["partition"] for s in backlog.samples
                if s.labels["logical_stream"] == "ordered" and s.labels["group"] == "o"}

    assert labelled() == {**{name: str(i) for i, name in enumerate(old)}, **{name: str(i) for i, name in enumerate(new)}}
    conn = get_connection()
    for name in old:
        for _, entries in conn.xreadgroup("o", "c", {name: ">"}) or []:
            conn.xack(name, "o", *[entry_id for entry_id, _ in entries])
    repartition("ordered", 4, say=lambda text: None)
    assert labelled() == {name: str(i) for i, name in enumerate(new)}


def test_the_command_refuses_a_stream_nothing_knows(redis):
    # The trial: "repartition nosuch 4" wrote a layout for a typo and exited 0.
    with pytest.raises(CommandError, match="no stream 'nosuch'"):
        call_command("repartition", "nosuch", "4")
    assert not redis.exists("{nosuch}:layout")
