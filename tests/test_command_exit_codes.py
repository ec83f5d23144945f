"""Every Shoal command's usage errors exit with the documented code (docs/operations.md, exit codes).

argparse's own exit 2 means EXIT_FORCED (a second TERM) here, so no Shoal command may use it: the
daemons (runconsumer, runreclaimer, runrelay, register) exit 3, EXIT_CONFIG, which a systemd unit
with ``RestartPreventExitStatus=3`` does not restart; the one-shot commands exit 1. Run as a user
runs them: ``manage.py <command> ...`` in a process of its own.
"""
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

DAEMON, ONE_SHOT = 3, 1

USAGE_ERRORS = {
    "runconsumer": (DAEMON, [["--bogus"], ["--threads", "0"], ["--workers", "abc"], ["--metrics-port", "99999"]]),
    "runreclaimer": (DAEMON, [["--bogus"], ["--interval", "nan"], ["--metrics-port", "99999"]]),
    "runrelay": (DAEMON, [["--bogus"], ["--metrics-port", "99999"], ["--metrics-port", "x"], ["-v", "7"]]),
    "register": (DAEMON, [["svc", "--address", "10.0.0.7", "--port", "99999"], ["svc", "--port", "8000"],
                          ["--address", "10.0.0.7", "--port", "8000"], ["svc", "--address", "a", "--port", "1", "--bogus"],
                          ["svc", "--address", "a", "--port", "1", "--weight", "-1"],
                          ["svc", "--address", "a", "--port", "1", "--scheme", "ftp"],
                          ["svc", "--address", "a", "--port", "1", "--interval", "0"],
                          ["svc", "--address", "a", "--port", "1", "--ttl", "nan"],
                          ["svc", "--address", "bad host", "--port", "8000"],
                          ["\udcff", "--address", "127.0.0.1", "--port", "9"]]),  # $'\xff': not UTF-8
    "publish": (ONE_SHOT, [["jobs", "{}", "--bogus"], [], ["jobs", "{}", "--maxlen", "x"]]),
    "replay": (ONE_SHOT, [["jobs", "--group", "a", "--all", "--bogus"], ["jobs", "--all"], ["jobs", "--group", "a"],
                          ["jobs", "--group", "a", "--all", "--id", "1-0"]]),
    "broadcast": (ONE_SHOT, [["ping", "--bogus"], [], ["ping", "--wait", "x"]]),
    "canceltask": (ONE_SHOT, [[], ["abc", "--bogus"]]),
    "repartition": (ONE_SHOT, [[], ["orders"], ["orders", "x"], ["orders", "1"], ["orders", "8", "--bogus"],
                               ["{orders}", "8"]]),
    "discover": (ONE_SHOT, [["--bogus"], ["svc", "--drain", "a", "--undrain", "b"], ["\udcff"]]),
}


def run(command, args, redis_url):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_url}
    return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), command, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("command", sorted(USAGE_ERRORS))
def test_usage_errors_exit_with_the_documented_code_in_one_line(command, redis_server):
    code, cases = USAGE_ERRORS[command]
    started = [(args, run(command, args, redis_server.url)) for args in cases]  # at once: each starts Django
    for args, proc in started:
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # e.g. a daemon retrying what it should refuse: it fails below
            proc.kill()
            out, err = proc.communicate()
        shown = f"manage.py {command} {' '.join(args)} exited {proc.returncode}:\n{err}"
        assert proc.returncode == code, shown
        assert "error: " in err.lower() and "Traceback" not in err, shown
        assert len(err.strip().splitlines()) == 1, shown  # what is wrong; --help has the usage


def test_help_still_exits_0(redis_server):
    proc = run("runrelay", ["--help"], redis_server.url)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "--metrics-port" in out, err
