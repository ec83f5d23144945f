"""Compaction of dead processes' metric files, on files written the way prometheus_client writes them."""
import os

from prometheus_client.mmap_dict import MmapedDict, mmap_key

from streams_app.metrics import multiprocess


def values(path):
    collector = multiprocess.LockedMultiProcessCollector(None, str(path))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in collector.collect() for s in m.samples}


def fill(path, pid, requests, latency):
    labels = {"view": "home"}
    store = MmapedDict(str(path / f"counter_{pid}.db"))
    store.write_value(mmap_key("requests", "requests_total", ["view"], ["home"], "help"), requests, 0.0)
    store.close()
    store = MmapedDict(str(path / f"histogram_{pid}.db"))
    for bound, count in latency.items():
        store.write_value(mmap_key("latency", "latency_bucket", ["view", "le"], [labels["view"], bound], "help"), count, 0.0)
    store.write_value(mmap_key("latency", "latency_sum", ["view"], ["home"], "help"), sum(latency.values()) / 10, 0.0)
    store.close()
    store = MmapedDict(str(path / f"gauge_livesum_{pid}.db"))
    store.write_value(mmap_key("inflight", "inflight", [], [], "help"), 1, 0.0)
    store.close()
    store = MmapedDict(str(path / f"gauge_all_{pid}.db"))
    store.write_value(mmap_key("started", "started", [], [], "help"), 1, 0.0)
    store.close()


def test_dead_processes_are_folded_into_archives_without_changing_totals(tmp_path):
    fill(tmp_path, 101, 5, {"0.1": 3, "+Inf": 2})
    fill(tmp_path, 102, 7, {"0.1": 1, "+Inf": 0})
    fill(tmp_path, 103, 11, {"0.1": 4, "+Inf": 4})
    before = values(tmp_path)
    assert before[("requests_total", (("view", "home"),))] == 23

    multiprocess.process_dead(101, str(tmp_path))
    multiprocess.process_dead(102, str(tmp_path))
    after = values(tmp_path)

    summed = {k: v for k, v in before.items() if not k[0].startswith(("inflight", "started"))}
    assert {k: v for k, v in after.items() if k in summed} == summed
    assert after[("latency_bucket", (("le", "0.1"), ("view", "home")))] == 8
    assert after[("latency_count", (("view", "home"),))] == 14
    # Gauges describe live processes: only pid 103's remain.
    assert after[("inflight", ())] == 1
    assert [k for k in after if k[0] == "started"] == [("started", (("pid", "103"),))]
    assert sorted(os.listdir(tmp_path)) == [
        ".lock", "counter_103.db", "counter_archive.db", "gauge_all_103.db", "gauge_livesum_103.db",
        "histogram_103.db", "histogram_archive.db",
    ]


def test_reset_empties_the_directory(tmp_path):
    fill(tmp_path, 7, 1, {"+Inf": 1})
    multiprocess.reset(str(tmp_path / "x"))
    multiprocess.reset(str(tmp_path))
    assert [name for name in os.listdir(tmp_path) if name.endswith(".db")] == []
    assert (tmp_path / "x").is_dir()


def test_a_file_being_created_does_not_fail_the_scrape(tmp_path):
    from streams_app.metrics import multiprocess

    multiprocess.reset(tmp_path)
    (tmp_path / "counter_4242.db").write_bytes(b"")  # a worker between open() and truncate()
    registry = multiprocess.multiprocess_registry(str(tmp_path))
    list(registry.collect())  # must not raise struct.error
