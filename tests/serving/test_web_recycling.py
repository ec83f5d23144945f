"""Recycling held while the code on disk cannot load (shoal_common/web_recycling.py), on its own: the master's
state file, a worker's reading of it, and the worker's choice at ``max_requests``. The load test against a
real master is in tests/serving/test_host_project_web.py."""
import json
import logging
import sys
from types import SimpleNamespace

from shoal_common import web_recycling
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


def test_a_worker_reads_the_state_at_most_once_a_recheck(tmp_path):
    path = tmp_path / "web_rollout.json"
    hold = web_recycling.Hold(str(path), log)
    now = [0.0]
    view = web_recycling.WorkerView(str(path), clock=lambda: now[0])
    assert view.held() is False  # no file yet: a master that never held
    hold.hold("broken")
    assert view.held() is False  # what it read a moment ago
    now[0] += web_recycling.RECHECK
    assert view.held() is True
    hold.release("fixed")
    now[0] += web_recycling.RECHECK
    assert view.held() is False


def worker(view, nr, recycle_at=200):
    return SimpleNamespace(recycling=view, recycle_at=recycle_at, max_requests=recycle_at, nr=nr,
                           recycle_deferred=False, pid=1234, log=log)


def test_a_worker_past_max_requests_is_not_recycled_while_held_and_is_once_released(tmp_path, caplog):
    path = tmp_path / "web_rollout.json"
    hold = web_recycling.Hold(str(path), log)
    hold.hold("broken")
    now = [0.0]
    w = worker(web_recycling.WorkerView(str(path), clock=lambda: now[0]), nr=199)
    with caplog.at_level(logging.WARNING, logger=log.name):
        ThreadWorker.defer_recycling_while_held(w)
        ThreadWorker.defer_recycling_while_held(w)
    assert w.max_requests == sys.maxsize  # gunicorn's `nr >= max_requests` never comes true
    assert caplog.text.count("keeps serving with the code it loaded") == 1
    hold.release("fixed")
    now[0] += web_recycling.RECHECK
    ThreadWorker.defer_recycling_while_held(w)
    assert w.max_requests == 200  # recycled at its next request, as gunicorn would have


def test_the_metric_shows_the_masters_state():
    assert list(RecyclingCollector(read=lambda: None).collect()) == []  # not under Shoal's gunicorn config
    held = {family.name: family.samples[0].value for family in RecyclingCollector(
        read=lambda: {"recycling": "held", "since": 100.0}, clock=lambda: 160.0).collect()}
    assert held == {"shoal_web_recycling_held": 1.0, "shoal_web_recycling_held_seconds": 60.0}
    normal = {family.name: family.samples[0].value for family in RecyclingCollector(
        read=lambda: {"recycling": "normal", "since": None}).collect()}
    assert normal == {"shoal_web_recycling_held": 0.0, "shoal_web_recycling_held_seconds": 0.0}
