"""Recycling held while the code on disk cannot load (shoal_common/web_recycling.py), on its own: the master's
state file, and a worker's request to be recycled at ``max_requests``. Against a real master:
tests/serving/test_gunicorn_recycling.py and tests/serving/test_host_project_web.py."""
import json
import logging
import os
import sys
from types import SimpleNamespace

from shoal_common import web_recycling, web_rollout
from shoal_common.web_worker import ThreadWorker
from streams_app.metrics.recycling import RecyclingCollector

log = logging.getLogger("tests.web_recycling")


def test_the_master_says_held_and_released_in_its_state_file(tmp_path, caplog):
    path = tmp_path / "web_rollout.json"
    hold = web_recycling.Hold(str(path), log)
    hold.write()
    assert json.loads(path.read_text())["recycling"] == "normal"
    with caplog.at_level(logging.INFO, logger=log.name):
        hold.hold("a rollout is under way", warn=False)  # routine: no warning
        since = json.loads(path.read_text())["since"]
        hold.hold("a rollout was aborted: worker (pid:1) could not load the application")
        hold.hold("a rollout was aborted: worker (pid:1) could not load the application")  # said once
        state = json.loads(path.read_text())
        assert state["recycling"] == "held" and state["reason"].startswith("a rollout was aborted")
        assert state["since"] == since  # held since the rollout began
        hold.release("worker (pid:2) loaded the application")
    assert json.loads(path.read_text()) == {"recycling": "normal", "since": None, "reason": None}
    assert caplog.text.count("RECYCLING HELD") == 1 and "Recycling resumed" in caplog.text


def worker(recycle_at=200):
    return SimpleNamespace(recycle_at=recycle_at, max_requests=recycle_at, recycle_asked=False, pid=os.getpid(), log=log)


def test_a_worker_past_max_requests_asks_the_master_and_serves_on(monkeypatch, caplog):
    read, write = os.pipe()
    monkeypatch.setattr(web_rollout, "_ready_w", write)  # what a worker inherits from Shoal's master
    w = worker()
    with caplog.at_level(logging.INFO, logger=log.name):
        ThreadWorker.ask_recycling(w)
    assert os.read(read, 100) == f"due {os.getpid()}\n".encode()
    assert w.max_requests == sys.maxsize and w.recycle_asked  # gunicorn's `nr >= max_requests` never comes true
    assert "it serves until the master has its replacement ready" in caplog.text
    os.close(read)
    os.close(write)


def test_outside_shoals_master_a_worker_is_recycled_as_gunicorn_does(monkeypatch):
    monkeypatch.setattr(web_rollout, "_ready_w", None)
    w = worker()
    ThreadWorker.ask_recycling(w)
    assert w.max_requests == 200  # exits by itself after this request


def test_the_metric_shows_the_masters_state():
    assert list(RecyclingCollector(read=lambda: None).collect()) == []  # not under Shoal's gunicorn config
    held = {family.name: family.samples[0].value for family in RecyclingCollector(
        read=lambda: {"recycling": "held", "since": 100.0}, clock=lambda: 160.0).collect()}
    assert held == {"shoal_web_recycling_held": 1.0, "shoal_web_recycling_held_seconds": 60.0}
    normal = {family.name: family.samples[0].value for family in RecyclingCollector(
        read=lambda: {"recycling": "normal", "since": None}).collect()}
    assert normal == {"shoal_web_recycling_held": 0.0, "shoal_web_recycling_held_seconds": 0.0}
