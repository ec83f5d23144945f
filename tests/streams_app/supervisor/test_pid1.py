"""The supervisor as PID 1 of a container: it reaps every orphan, not only its own workers."""
import os
import shutil
import signal
import subprocess
import sys

import pytest

from tests.waiting import wait_for


def unshare_works():
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c",
                           "import os, sys; sys.exit(os.getpid() != 1)"], capture_output=True, timeout=30)
    return done.returncode == 0


pytestmark = pytest.mark.skipif(not unshare_works(), reason="needs `unshare --pid` (root or user namespaces)")


def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_a_pid1_master_reaps_the_orphaned_subprocess_of_a_killed_worker(run_consumer, redis, tmp_path):
    # A container runtime starts the command as PID 1 of a new PID namespace; unshare does the same.
    master = run_consumer("spawns:g", "--workers", "1",
                          prefix=("unshare", "--pid", "--fork", "--kill-child"))
    redis.xadd("spawns", {"payload": f'{{"dir": "{tmp_path}"}}'})
    wait_for(lambda: (tmp_path / "child.pid").exists() and (tmp_path / "worker.pid").exists(), timeout=60,
             what="the handler's subprocess to start")
    worker, child = int((tmp_path / "worker.pid").read_text()), int((tmp_path / "child.pid").read_text())
    os.kill(worker, signal.SIGKILL)  # as the OOM killer or the stuck-handler kill would
    # The child outlives its worker by a second or two, then exits: as an orphan of PID 1.
    wait_for(lambda: state(child) is None, timeout=30,
             what=f"the orphan {child} to be reaped (state {state(child)!r}; 'Z' is a zombie)")
    assert master.proc.poll() is None, master.output()


@pytest.mark.parametrize("mode", [["--workers", "2"], []], ids=["supervisor", "single-process"])
def test_a_term_during_start_up_is_honoured_once_the_consumers_are_up(run_consumer, mode, tmp_path):
    # As PID 1 the kernel drops a signal that has no handler: Django's start-up is such a window. The
    # test settings hold start-up for 3 s once they begin loading, and say so in a file.
    marker = tmp_path / "loading"
    proc = run_consumer("jobs:a", *mode, prefix=("unshare", "--pid", "--fork", "--kill-child"),
                        env={"SHOAL_TEST_SLOW_START": str(marker)})
    wait_for(marker.exists, timeout=60, what="the consumer to start loading its settings")
    with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as children:
        (pid1,) = [int(pid) for pid in children.read().split()]  # unshare's child: PID 1 of the namespace
    os.kill(pid1, signal.SIGTERM)
    assert proc.wait(timeout=90) == 0, proc.output()
    assert "started" in proc.output() and "stopped" in proc.output(), proc.output()


def term_pending(pid):
    with open(f"/proc/{pid}/status") as status:
        masks = {k: int(v, 16) for k, v in (line.split(":") for line in status if line[:6] in ("SigPnd", "ShdPnd"))}
    return any(mask & (1 << (signal.SIGTERM - 1)) for mask in masks.values())


def test_a_second_term_during_start_up_stops_at_once_with_exit_2(run_consumer, tmp_path):
    marker = tmp_path / "loading"
    proc = run_consumer("jobs:a", "--workers", "1", env={"SHOAL_TEST_SLOW_START": str(marker)})
    wait_for(marker.exists, timeout=60, what="the consumer to start loading its settings")
    proc.signal(signal.SIGTERM)
    # Two TERMs sent back to back merge into one: send the second once the first was delivered.
    wait_for(lambda: not term_pending(proc.pid), timeout=30, what="the first TERM to be delivered")
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 2, proc.output()  # EXIT_FORCED, as a second TERM means later on
