"""The gunicorn master's registration supervisor (shoal_common/web_supervision.py) on its own: run from the
master's loop with no thread of its own, its status file written by two writers at once (it and the
registration process), and an exit path that never raises (it once did, FileNotFoundError on a shared temp
file, and a halting master exited 1, not 3)."""
import json
import logging
import os
import sys
import threading

from shoal_common.web_supervision import STATUS_ENV, RegistrationSupervisor
from tests.waiting import wait_for

# A registration process that lives until its stdin closes, as the real one does.
UNTIL_EOF = [sys.executable, "-c", "import sys; sys.stdin.read()"]
log = logging.getLogger("tests.registration_supervisor")


def test_status_writes_from_two_threads_at_once_never_fail(tmp_path):
    status = tmp_path / "web_registration.json"
    supervisor = RegistrationSupervisor(UNTIL_EOF, str(tmp_path), log, str(status)).start()
    errors = []

    def write(state):
        for _ in range(500):
            try:
                supervisor._write_status(state)
            except Exception as exc:  # noqa: BLE001 - what the test counts
                errors.append(exc)

    try:
        threads = [threading.Thread(target=write, args=(state,)) for state in ("running", "restarting")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        supervisor.stop()
    assert errors == [], f"{len(errors)} failed writes, e.g. {errors[0]!r}"
    assert json.loads(status.read_text())["state"] == "stopped"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # no temp file left behind


def test_stop_ends_with_stopped_after_begin_stop(tmp_path):
    # The master's stop() says "stopping" (begin_stop), its exit hook then "stopped": the last word is stop()'s.
    status = tmp_path / "web_registration.json"
    for _ in range(5):
        supervisor = RegistrationSupervisor(UNTIL_EOF, str(tmp_path), log, str(status)).start()
        supervisor.begin_stop()
        assert json.loads(status.read_text())["state"] == "stopping"
        supervisor.stop()
        assert json.loads(status.read_text())["state"] == "stopped"


def test_the_supervisor_runs_no_thread_of_its_own(tmp_path):
    # Issue 48: a thread of it in gunicorn's master made every fork of a worker a fork of a multi-threaded
    # process (Python 3.12+ warns: it may deadlock the child).
    before = set(threading.enumerate())
    supervisor = RegistrationSupervisor(UNTIL_EOF, str(tmp_path), log, str(tmp_path / "status.json")).start()
    try:
        supervisor.tick()
        assert set(threading.enumerate()) == before
    finally:
        supervisor.stop()


def test_tick_restarts_a_dead_registration_process_after_its_back_off(tmp_path):
    clock = [1000.0]
    status = tmp_path / "web_registration.json"
    supervisor = RegistrationSupervisor(UNTIL_EOF, str(tmp_path), log, str(status), backoff=(1.0, 30.0),
                                        clock=lambda: clock[0]).start()
    try:
        first = supervisor.process
        first.kill()
        first.wait(30)
        supervisor.tick()
        assert supervisor.process is first and json.loads(status.read_text())["state"] == "restarting"
        clock[0] += 0.5
        supervisor.tick()
        assert supervisor.process is first  # still waiting out the back-off
        clock[0] += 0.5
        supervisor.tick()
        assert supervisor.process is not first and supervisor.process.poll() is None
        assert supervisor.restarts == 1 and json.loads(status.read_text())["state"] == "running"
        # Dead again at once: a crash loop waits twice as long.
        supervisor.process.kill()
        supervisor.process.wait(30)
        supervisor.tick()
        assert supervisor.restart_at == clock[0] + 2.0
    finally:
        supervisor.stop()


def test_no_restart_once_stopping(tmp_path):
    supervisor = RegistrationSupervisor(UNTIL_EOF, str(tmp_path), log, str(tmp_path / "status.json"),
                                        clock=lambda: 0.0).start()
    supervisor.begin_stop()
    supervisor.process.wait(30)
    supervisor.tick()
    assert supervisor.restarts == 0 and supervisor.restart_at is None
    supervisor.stop()


def test_stop_never_raises_when_the_status_file_cannot_be_written(tmp_path, caplog):
    # The master's on_exit runs this; an exception there turned a halt's exit code 3 into 1.
    var = tmp_path / "var"
    var.mkdir()
    supervisor = RegistrationSupervisor(UNTIL_EOF, str(tmp_path), log, str(var / "web_registration.json")).start()
    var.rename(tmp_path / "gone")  # var/ removed under the master (a clean-up, a full disk: the write fails)
    with caplog.at_level(logging.WARNING, logger=log.name):
        supervisor.stop()
    assert supervisor.process.poll() is not None  # the registration process was still told to stop
    assert "could not write" in caplog.text



def test_a_project_without_discovery_app_gets_no_registration_and_no_restarts(tmp_path):
    # install.md: "leave out discovery_app if you use no registry". The package is importable (same wheel), so
    # the master starts the registration process; it finds discovery_app not installed, says "off" and idles.
    settings = tmp_path / "no_discovery_settings.py"
    settings.write_text("from tests.settings import *  # noqa\n"
                        "INSTALLED_APPS = [app for app in INSTALLED_APPS if app != 'discovery_app']\n")
    status = tmp_path / "web_registration.json"
    argv = [sys.executable, "-m", "discovery_app.web_registration", "127.0.0.1", "1", "{}", "web-test"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()]),
           "DJANGO_SETTINGS_MODULE": "no_discovery_settings", STATUS_ENV: str(status)}
    supervisor = RegistrationSupervisor(argv, os.getcwd(), log, str(status))
    old_env = dict(os.environ)
    os.environ.update(env)  # Popen inherits the master's environment, as under gunicorn
    try:
        supervisor.start()
    finally:
        os.environ.clear()
        os.environ.update(old_env)
    try:
        wait_for(lambda: status.exists() and json.loads(status.read_text())["state"] == "off", timeout=60,
                 what="the registration process says off")
        assert supervisor.process.poll() is None  # idles: nothing to restart, no exit code to lose
        assert supervisor.restarts == 0
    finally:
        supervisor.stop()
    assert supervisor.process.returncode == 0
