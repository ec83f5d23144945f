"""runconsumer's supervisor options: bad combinations are CommandErrors; workers inherit no socket."""
import os
import signal

import pytest
from django.core.management import CommandError, call_command

from streams_app.redis.connection import get_connection
from streams_app.supervisor.spawn import ExecSpawner
from tests.waiting import wait_for


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "2", "--min-workers", "1", "--max-workers", "3"], "not both"),
        (["--workers", "2", "--max-workers", "3"], "not both"),
        (["--min-workers", "3", "--max-workers", "2"], "--min-workers (3) is above --max-workers (2)"),
        (["--min-workers", "2"], "--min-workers needs --max-workers"),
        (["--workers", "2", "--target-lag", "5"], "--target-lag only applies"),
        (["--heartbeat-timeout", "9"], "--heartbeat-timeout needs a supervisor"),
        (["--heartbeat-timeout", "9", "--scale-interval", "2"], "--heartbeat-timeout, --scale-interval need a supervisor"),
        (["--workers", "2", "--scale-interval", "2"], "--scale-interval applies to autoscaling or --metrics-port"),
        (["--workers", "1", "--heartbeat-interval", "5", "--heartbeat-timeout", "5"], "must be above --heartbeat-interval"),
        (["--preload"], "--preload needs a supervisor"),
    ],
)
def test_bad_option_combinations_are_explained(args, message):
    with pytest.raises(CommandError) as raised:
        call_command("runconsumer", "jobs:a", *args)
    assert message in str(raised.value)


def sockets(pid):
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def test_a_worker_inherits_no_socket_of_the_master(redis_server, monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    conn = get_connection()
    conn.ping()  # the master holds an open Redis connection when it spawns
    mine = sockets(os.getpid())
    assert mine
    proc, heartbeat = ExecSpawner(["jobs:a"], heartbeat_interval=0.5, shutdown_timeout=1)(1)
    try:
        wait_for(lambda: heartbeat.last_beat() > 0, timeout=30, what="the worker consuming")
        theirs = sockets(proc.pid)
        assert theirs, "the worker has no Redis connection of its own"
        assert not theirs & mine, "the worker shares a socket with the master"
        assert get_connection().ping()  # and the master's connection still works
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        heartbeat.close()


def test_bad_ports_huge_pools_and_a_lone_metrics_addr_are_configuration_errors(run_consumer):
    for args, says in [
        (["--metrics-port", "99999"], "invalid port number (1-65535) value"),
        (["--workers", "100000"], "--workers 100000 is more than one supervisor runs (256)"),
        (["--min-workers", "1", "--max-workers", "5000"], "--max-workers 5000 is more than one supervisor runs"),
        (["--metrics-addr", "0.0.0.0"], "--metrics-addr needs --metrics-port"),
    ]:
        proc = run_consumer("jobs:a", *args)
        code = proc.wait(timeout=60)
        assert code != 0 and says in proc.output(), (args, code, proc.output())
        assert "Traceback" not in proc.output(), proc.output()
