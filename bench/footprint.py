"""Memory and start-up of runconsumer: one process, the supervisor with --workers 2, and with --preload.

    .venv/bin/python bench/footprint.py [--repeat 3] [--messages 2000] [--preload] [--age SECONDS]

Per run: a fresh stream with one message already waiting, then ``runconsumer footprint:bench`` (as
README says; ``--workers 2`` for the supervisor, ``--workers 2 --preload`` for workers forked from a
zygote) started as a subprocess; start-up is the time from just before the subprocess starts to the
handler's own clock when it handles that message. Then --messages more are consumed (threads,
connections and caches warmed up) and the memory of the processes this bench started is read from
/proc/PID/smaps_rollup: RSS, PSS, and unique memory (USS = Private_Clean + Private_Dirty, what the
kernel would free if that process exited). The workers and the zygote are the master's children
(/proc/PID/task/PID/children), told apart by their process titles. Prints the load average with
every figure. With a supervisor, it then sends SIGTTIN and times the added worker from the signal to its
process title saying it consumes (what a crash replacement or autoscaling waits for; a worker sets
that title once Django and the consumers are loaded, just before it connects and creates its groups). --preload adds the ``--workers 2 --preload`` runs; --age SECONDS reads the memory of
every supervised run a second time after that long with messages flowing (copy-on-write pages are
un-shared as a worker touches the objects on them).
"""
import argparse
import os
import signal
import statistics
import time

from common import manage, setup_django, start_redis

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


def label(pid, master):
    if pid == master:
        return "master"
    title = ""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read().decode(errors="replace")
    except FileNotFoundError:
        pass
    return "zygote" if "runconsumer zygote" in title else "worker"


def snapshot(proc, workers):
    if workers == 1:
        return [("one process", proc.pid, *memory(proc.pid))]
    pids = [proc.pid, *children(proc.pid)]
    rows = [(label(pid, proc.pid), pid, *memory(pid)) for pid in pids]
    order = {"master": 0, "zygote": 1, "worker": 2}
    return sorted(rows, key=lambda row: order[row[0]])


def run(server, workers, messages, preload=False, age=0):
    from streams_app import publish, publish_many

    client = server.client()
    client.delete(STREAM, "bench:first")
    client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    publish(STREAM, {"first": True})
    pool = [] if workers == 1 else ["--workers", str(workers), *(["--preload"] if preload else [])]
    started = time.time()
    proc = manage("runconsumer", f"{STREAM}:{GROUP}", *pool, "-v", "0", redis_url=server.url,
                  env={"DJANGO_SETTINGS_MODULE": "bench.settings"})
    try:
        wait_for(lambda: client.llen("bench:first") >= 1, "the first message was not handled")
        first = float(client.lindex("bench:first", 0)) - started
        publish_many(STREAM, [{"n": n} for n in range(messages)])
        if workers > 1:
            wait_for(lambda: consuming(proc.pid) >= workers, f"{workers} workers did not start consuming")
        info = lambda: client.xinfo_groups(STREAM)[0]  # noqa: E731
        wait_for(lambda: info()["lag"] == 0 and info()["pending"] == 0, "the messages were not consumed")
        time.sleep(1)  # past the boot: what a consumer holds while it runs
        snapshots = [(0, snapshot(proc, workers))]
        added = None
        if workers > 1:
            # One more worker (SIGTTIN), as a crash replacement or autoscaling starts one: signal to
            # its process title saying it consumes. Its memory is not in the snapshots above.
            began = time.monotonic()
            proc.send_signal(signal.SIGTTIN)
            wait_for(lambda: consuming(proc.pid) >= workers + 1, "the added worker did not start consuming")
            added = time.monotonic() - began
        if age and workers > 1:
            deadline = time.monotonic() + age
            while time.monotonic() < deadline:  # a steady trickle, so the workers keep running handlers
                publish_many(STREAM, [{"n": n} for n in range(100)])
                time.sleep(0.5)
            wait_for(lambda: info()["lag"] == 0 and info()["pending"] == 0, "the messages were not consumed")
            snapshots.append((age, snapshot(proc, workers)))
        return first, added, snapshots
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def print_memory(rows):
    for name, pid, rss, pss, uss in rows:
        print(f"    {name:<12} pid {pid:<7} RSS {rss:6.1f} MiB  PSS {pss:6.1f} MiB  USS {uss:6.1f} MiB")
    print(f"    {'total PSS':<24} {sum(row[3] for row in rows):6.1f} MiB")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--messages", type=int, default=2_000, help="messages consumed before memory is read")
    parser.add_argument("--preload", action="store_true", help="also runconsumer --workers 2 --preload")
    parser.add_argument("--age", type=float, default=0,
                        help="with a supervisor, read the memory again after this many seconds of messages")
    args = parser.parse_args()
    server = start_redis()
    try:
        setup_django(server.url, settings="bench.settings")
        print(f"{os.cpu_count()} CPUs; {load()}")
        setups = [(1, False), (2, False)] + ([(2, True)] if args.preload else [])
        for workers, preload in setups:
            label = ("runconsumer (one process)" if workers == 1
                     else f"runconsumer --workers {workers}" + (" --preload" if preload else ""))
            starts, adds = [], []
            for i in range(args.repeat):
                first, added, snapshots = run(server, workers, args.messages, preload=preload, age=args.age)
                starts.append(first)
                print(f"{label}, run {i + 1}: start to first message handled {first:.2f} s   {load()}")
                if added is not None:
                    adds.append(added)
                    print(f"  SIGTTIN to the added worker consuming {added:.2f} s   {load()}")
                for after, rows in snapshots:
                    if after:
                        print(f"  after {after:.0f} s more of messages   {load()}")
                    print_memory(rows)
            print(f"{label}: start-up median {statistics.median(starts):.2f} s "
                  f"(min {min(starts):.2f}, max {max(starts):.2f})"
                  + (f"; added worker median {statistics.median(adds):.2f} s" if adds else "") + f"   {load()}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
