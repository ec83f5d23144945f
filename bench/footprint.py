"""Memory and start-up of runconsumer: one process, and the supervisor with --workers 2.

    .venv/bin/python bench/footprint.py [--repeat 3] [--messages 2000] [--preload]

Per run: a fresh stream with one message already waiting, then ``runconsumer footprint:bench`` (as
README says; ``--workers 2`` for the supervisor) started as a subprocess; start-up is the time from
just before the subprocess starts to the handler's own clock when it handles that message. Then
--messages more are consumed (threads, connections and caches warmed up) and the memory of the
processes this bench started is read from /proc/PID/smaps_rollup: RSS, PSS, and unique memory
(USS = Private_Clean + Private_Dirty, what the kernel would free if that process exited). The workers
are the master's children (/proc/PID/task/PID/children). Prints the load average with every figure.
--preload adds an estimate of copy-on-write sharing: a process (not Shoal's supervisor) that sets Django
up once and forks two consumers, measured the same way.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

from common import ROOT, manage, setup_django, start_redis

STREAM, GROUP = "footprint", "bench"


def load():
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def memory(pid):
    """RSS, PSS and USS of our own child ``pid``, in MiB."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return fields["Rss"], fields["Pss"], fields["Private_Clean"] + fields["Private_Dirty"]


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def consuming(pid):
    """How many of the master's workers say (in their process title) that they are consuming."""
    count = 0
    for child in children(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                count += b"worker consuming" in f.read()
        except FileNotFoundError:
            pass
    return count


def wait_for(predicate, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout}s")
        time.sleep(0.01)


def preloaded_master(workers):
    """Not Shoal's supervisor: Django set up once, then ``workers`` forks each running one consumer.

    An estimate of what a preloaded master would save by copy-on-write (no HUP, no restarts, no
    supervision: only the memory is comparable).
    """
    import gc
    import sys

    sys.path.insert(0, str(ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    gc.freeze()  # what preloading servers do, so the collector does not copy every shared page
    pids = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            call_command("runconsumer", f"{STREAM}:{GROUP}", "-v", "0")
            os._exit(0)
        pids.append(pid)
    signal.signal(signal.SIGTERM, lambda *_: [os.kill(pid, signal.SIGTERM) for pid in pids])
    for pid in pids:
        while True:
            try:
                os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue


def run(server, workers, messages, preload=False):
    from streams_app import publish, publish_many

    client = server.client()
    client.delete(STREAM, "bench:first")
    client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    publish(STREAM, {"first": True})
    pool = [] if workers == 1 else ["--workers", str(workers)]
    started = time.time()
    if preload:
        proc = subprocess.Popen([sys.executable, __file__, "--preloaded-master", str(workers)], cwd=ROOT,
                                env={**os.environ, "REDIS_URL": server.url, "DJANGO_SETTINGS_MODULE": "bench.settings"})
    else:
        proc = manage("runconsumer", f"{STREAM}:{GROUP}", *pool, "-v", "0", redis_url=server.url,
                      env={"DJANGO_SETTINGS_MODULE": "bench.settings"})
    try:
        wait_for(lambda: client.llen("bench:first") >= 1, "the first message was not handled")
        first = float(client.lindex("bench:first", 0)) - started
        publish_many(STREAM, [{"n": n} for n in range(messages)])
        if preload:
            wait_for(lambda: len(children(proc.pid)) >= workers, f"{workers} forks did not start")
        elif workers > 1:
            wait_for(lambda: consuming(proc.pid) >= workers, f"{workers} workers did not start consuming")
        info = lambda: client.xinfo_groups(STREAM)[0]  # noqa: E731
        wait_for(lambda: info()["lag"] == 0 and info()["pending"] == 0, "the messages were not consumed")
        time.sleep(1)  # past the boot: what a consumer holds while it runs
        procs = [("master" if workers > 1 else "one process", proc.pid)]
        procs += [(f"worker {i + 1}", pid) for i, pid in enumerate(children(proc.pid))] if workers > 1 else []
        return first, [(name, pid, *memory(pid)) for name, pid in procs]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--messages", type=int, default=2_000, help="messages consumed before memory is read")
    parser.add_argument("--preload", action="store_true",
                        help="also a preloaded master forking 2 consumers (an estimate of copy-on-write sharing)")
    parser.add_argument("--preloaded-master", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.preloaded_master:
        return preloaded_master(args.preloaded_master)
    server = start_redis()
    try:
        setup_django(server.url, settings="bench.settings")
        print(f"{os.cpu_count()} CPUs; {load()}")
        for workers in (1, 2):
            label = "runconsumer (one process)" if workers == 1 else f"runconsumer --workers {workers}"
            starts = []
            for i in range(args.repeat):
                first, mem = run(server, workers, args.messages)
                starts.append(first)
                print(f"{label}, run {i + 1}: start to first message handled {first:.2f} s   {load()}")
                for name, pid, rss, pss, uss in mem:
                    print(f"    {name:<12} pid {pid:<7} RSS {rss:6.1f} MiB  PSS {pss:6.1f} MiB  USS {uss:6.1f} MiB")
            print(f"{label}: start-up median {statistics.median(starts):.2f} s "
                  f"(min {min(starts):.2f}, max {max(starts):.2f})   {load()}", flush=True)
        if args.preload:
            first, mem = run(server, 2, args.messages, preload=True)
            print(f"preloaded master + 2 forks (not Shoal's supervisor): first message {first:.2f} s   {load()}")
            for name, pid, rss, pss, uss in mem:
                print(f"    {name:<12} pid {pid:<7} RSS {rss:6.1f} MiB  PSS {pss:6.1f} MiB  USS {uss:6.1f} MiB")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
