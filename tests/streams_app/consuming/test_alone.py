"""consuming/alone.py: a suspect's run counts as alone (and its death as its own) only when nothing else
of the process ran as it started. One that waited ALONE_WAIT_SECONDS and runs beside others is not: a
user trial saw a suspect that never failed dead-lettered at max_deliveries 1 for a neighbour's death."""
import threading
from types import SimpleNamespace

from streams_app.consuming import alone


def observe(seen):
    """A chunk of one suspect that records whether it runs alone (what the run ledger records)."""
    def run():
        seen.append(alone.holding())
        return SimpleNamespace(acked=[])
    return run


def test_a_suspect_that_starts_with_nothing_else_running_runs_alone():
    gate = alone.Gate()
    seen = []
    gate.run_alone(observe(seen))
    assert seen == [True]
    assert alone.holding() is False  # outside the suspect's run


def test_a_suspect_that_starts_late_beside_a_running_chunk_does_not_run_alone(monkeypatch):
    monkeypatch.setattr(alone, "ALONE_WAIT_SECONDS", 0.05)
    gate = alone.Gate()
    assert gate.enter() is True  # a chunk runs, and keeps running past the suspect's wait
    seen = []
    thread = threading.Thread(target=gate.run_alone, args=(observe(seen),))
    thread.start()
    thread.join(10)
    assert seen == [False]
    gate.leave(False)
