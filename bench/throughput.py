"""Throughput of runconsumer against a plain redis-py loop, in one run on one private Redis.

    .venv/bin/python bench/throughput.py [--messages 200000] [--repeat 3] [--busy] [--workers 2]
        [--codec orjson] [--typed] [--profile PREFIX] [--gc-threshold N]

(a) plain: XREADGROUP COUNT 500, json.loads per entry, one XACK per batch (the floor any Python
consumer pays); (b) runconsumer noop:steady (bench/benchapp) with a no-op handler and default settings,
one process; (c) with --workers N > 1, the supervisor (runconsumer --workers N) on the same entries,
read again by a fresh group. (a) and (b) report their own steady state: msgs/s and CPU per message
from the first handled entry to the last (start-up left out); the outside timing (first entry read by
the group to last acked, polled) is printed beside it, with the load average and INFO commandstats per
1,000 messages. --repeat N alternates (a) and (b) N times and prints medians: on a shared machine one
pair says little. --busy runs one spinning process beside both sides. --profile runs (b) under py-spy
(bench/spy_summary.py reads the result); --gc-threshold is an experiment on the garbage collector.
--codec sets STREAMS["CODEC"] for the publisher and the consumers; --typed adds a datetime, a Decimal
and a UUID to each payload (the plain loop still only parses the JSON).
"""
import argparse
import datetime
import decimal
import gc
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from common import ROOT, at_least, positive, setup_django, start_redis, time_consumption

PY_SPY = os.environ.get("PY_SPY", str(ROOT / ".venv2" / "bin" / "py-spy"))


def plain_loop(url, stream, group, total):
    import redis

    if os.environ.get("BENCH_GC_THRESHOLD"):  # as bench/settings.py does for runconsumer
        gc.set_threshold(int(os.environ["BENCH_GC_THRESHOLD"]))
    client = redis.Redis.from_url(url)
    client.xgroup_create(stream, group, id="0")  # the caller destroyed any earlier one
    done = 0
    first = None
    while done < total:
        reply = client.xreadgroup(group, "plain", {stream: ">"}, count=500, block=1000)
        if not reply:
            continue
        entries = reply[0][1]
        if first is None:
            if os.environ.get("BENCH_GC_FREEZE"):  # as bench/benchapp's handler does at its first entry
                gc.freeze()
            first = (time.monotonic(), time.process_time())  # as the consumer's handler: at its first entry
        for _, fields in entries:
            json.loads(fields[b"payload"])
        client.xack(stream, group, *[entry_id for entry_id, _ in entries])
        done += len(entries)
    last = (time.monotonic(), time.process_time())
    client.rpush("bench:steady", json.dumps({"first": first, "last": last, "handled": done}))


def steady_figures(client, timeout=60):
    """(msgs/s, CPU µs per message) from the first handled entry to the last, as the process measured them."""
    reply = client.blpop("bench:steady", timeout)
    if reply is None:
        raise TimeoutError("no steady-state report from the consuming process")
    report = json.loads(reply[1])
    (t0, cpu0), (t1, cpu1) = report["first"], report["last"]
    intervals = report["handled"] - 1
    return intervals / (t1 - t0), (cpu1 - cpu0) / intervals * 1e6


def spin():
    while True:
        pass


def payload(n, typed):
    if not typed:
        return {"n": n, "pad": "x" * 40}
    return {"n": n, "at": datetime.datetime.now(datetime.UTC), "total": decimal.Decimal("9.99"), "id": uuid.uuid4()}


def publish(total, stream, typed=False):
    from streams_app import publish_many

    for start in range(0, total, 10_000):
        publish_many(stream, [payload(n, typed) for n in range(start, min(total, start + 10_000))])


def run_consumer(client, url, total, *options, group="bench", profile=None):
    """(seconds, CPU seconds or None) ``runconsumer noop:<group> [options]`` takes to consume ``total`` entries; then TERM it.

    With ``profile`` (a file name), the process runs under py-spy, which samples every thread.
    """
    env = {"DJANGO_SETTINGS_MODULE": "bench.settings", "BENCH_TOTAL": str(total)}
    command = [sys.executable, str(ROOT / "manage.py"), "runconsumer", f"noop:{group}", "-v", "0", *options]
    if profile:
        command = [PY_SPY, "record", "--threads", "--gil", "--nonblocking", "-r", "250", "-f", "raw", "-o",
                   profile, "--", *command]
    proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "REDIS_URL": url, **env})
    try:
        # One process: its CPU time too (with --workers N the work is in the children; under py-spy the
        # pid is py-spy's, so the outside CPU figure is left out).
        if options or profile:
            return time_consumption(client, "noop", group, total), None
        return time_consumption(client, "noop", group, total, pid=proc.pid)
    finally:
        # py-spy does not pass SIGTERM on: stop the consumer it started, and py-spy writes its file and exits.
        for pid in children(proc.pid) if profile else [proc.pid]:
            os.kill(pid, signal.SIGTERM)
        proc.wait(60)


def children(pid):
    """Process ids that our own child ``pid`` started (Linux)."""
    tasks = Path(f"/proc/{pid}/task")
    return [int(child) for task in tasks.iterdir() for child in (task / "children").read_text().split()]


def fresh_group(client, stream, group):
    """Forget ``group`` (if a previous run made it), so the next consumer reads every entry again."""
    if any(info["name"] in (group, group.encode()) for info in client.xinfo_groups(stream)):
        client.xgroup_destroy(stream, group)


def rewind_group(client, stream, group):
    """Move ``group`` (if a previous run made it) back to the start, so the next consumer reads every entry again.

    Not destroyed: runconsumer would see its group recreated and hold reads while it settles
    (lost-group protection), which is a start-up the steady figures should not depend on.
    """
    if any(info["name"] in (group, group.encode()) for info in client.xinfo_groups(stream)):
        client.xgroup_setid(stream, group, "0", entries_read=0)


def loadavg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def commandstats(client, total):
    """Calls per 1,000 messages of each command since CONFIG RESETSTAT, leaving out the bench's own."""
    ours = {"xinfo|groups", "xinfo", "config|resetstat", "info", "blpop", "rpush", "config"}
    calls = {name.removeprefix("cmdstat_"): stats["calls"] for name, stats in client.info("commandstats").items()}
    return "  ".join(f"{name} {n * 1000 / total:.2f}" for name, n in sorted(calls.items()) if name not in ours)


def one_side(client, label, total, start):
    """Runs one side (``start`` returns (outside seconds, outside CPU seconds)) and prints its figures."""
    client.delete("bench:steady")
    client.config_resetstat()
    load_before = loadavg()
    outside, outside_cpu = start()
    rate, cpu = steady_figures(client)
    outside_text = f"{total / outside:,.0f} msgs/s" + (f", {outside_cpu / total * 1e6:.2f} µs/msg" if outside_cpu else "")
    print(f"{label:<38}{rate:>10,.0f} msgs/s steady  CPU {cpu:.2f} µs/msg  "
          f"(outside: {outside_text})  load {load_before} -> {loadavg()}")
    print(f"{'':<38}per 1,000 msgs: {commandstats(client, total)}")
    return rate, cpu


def pair(client, url, total, label="", profile=None):
    """(a) then (b) on fresh groups; prints both and their ratios; returns ((rate, cpu) of a, (rate, cpu) of b)."""
    def plain():
        proc = multiprocessing.Process(target=plain_loop, args=(url, "noop", "plain", total))
        proc.start()
        try:
            return time_consumption(client, "noop", "plain", total, pid=proc.pid)
        finally:
            proc.join()

    fresh_group(client, "noop", "plain")
    a = one_side(client, f"{label}(a) plain redis-py loop", total, plain)
    rewind_group(client, "noop", "steady")
    b = one_side(client, f"{label}(b) runconsumer, 1 process", total,
                 lambda: run_consumer(client, url, total, group="steady", profile=profile))
    if profile:
        print(f"{'':<38}py-spy samples of every thread: {profile}")
    print(f"{label}ratio b/a: {b[0] / a[0]:.2f}  CPU per message b/a: {b[1] / a[1]:.2f}")
    return a, b


def print_medians(pairs):
    def median(values):
        return statistics.median(values)

    (a_rates, a_cpus), (b_rates, b_cpus) = (zip(*side) for side in zip(*pairs))
    ratios = [b[0] / a[0] for a, b in pairs]
    cpu_ratios = [b[1] / a[1] for a, b in pairs]
    print(f"medians of {len(pairs)} pairs: (a) {median(a_rates):,.0f} msgs/s {median(a_cpus):.2f} µs/msg;"
          f" (b) {median(b_rates):,.0f} msgs/s {median(b_cpus):.2f} µs/msg")
    print(f"ratios b/a: {' '.join(f'{r:.2f}' for r in ratios)}  median {median(ratios):.2f}")
    print(f"CPU per message b/a: {' '.join(f'{r:.2f}' for r in cpu_ratios)}  median {median(cpu_ratios):.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=at_least(10_000, " (the steady rate needs reads of 500 over a measurable time)"), default=200_000)
    parser.add_argument("--workers", type=positive, default=1,
                        help="with N > 1, also time the supervisor with N worker processes (runconsumer --workers N)")
    parser.add_argument("--repeat", type=positive, default=1,
                        help="alternate (a) and (b) N times and print the median ratio b/a")
    parser.add_argument("--redis-counts", action="store_true",
                        help="STREAMS['COUNT_HANDLER_RUNS'] = False: Redis's own delivery counts, no run ledger")
    parser.add_argument("--codec", help="STREAMS['CODEC'] of the publisher and the consumers (default: the setting's)")
    parser.add_argument("--typed", action="store_true", help="payloads with a datetime, a Decimal and a UUID")
    parser.add_argument("--busy", action="store_true",
                        help="run a CPU hog (one process spinning) beside both sides, started and stopped here")
    parser.add_argument("--profile", metavar="PREFIX",
                        help=f"run (b) under py-spy ({PY_SPY}), raw samples of every thread to PREFIX.<run>.txt")
    parser.add_argument("--gc-threshold", type=int, metavar="N",
                        help="an experiment: gc.set_threshold(N) in both sides (default 700), to see what the collector costs")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="an experiment: gc.freeze() in both sides at their first entry (start-up's objects out of the collector's way)")
    args = parser.parse_args()
    if args.gc_freeze:
        os.environ["BENCH_GC_FREEZE"] = "1"
    if args.gc_threshold:
        os.environ["BENCH_GC_THRESHOLD"] = str(args.gc_threshold)  # the plain loop and runconsumer read it
    streams = {"CODEC": args.codec} if args.codec else {}
    if args.redis_counts:
        streams["COUNT_HANDLER_RUNS"] = False
    if streams:
        os.environ["SHOAL_TEST_STREAMS"] = json.dumps(streams)  # tests.settings reads it, here and in runconsumer
    server = start_redis()
    try:
        setup_django(server.url)
        client = server.client()
        publish(args.messages, "noop", args.typed)
        kind = "typed " if args.typed else ""
        print(f"published {args.messages} {kind}messages with codec {args.codec or 'default'} to a private redis-server on port {server.port}")

        hog = None
        if args.busy:
            hog = multiprocessing.Process(target=spin, daemon=True)
            hog.start()
            print(f"--busy: a CPU hog (pid {hog.pid}, one process spinning) runs beside both sides")
        if args.gc_freeze:
            print("--gc-freeze: gc.freeze() in both sides at their first entry")
        if args.gc_threshold:
            print(f"--gc-threshold: gc.set_threshold({args.gc_threshold}) in both sides")
        print(f"load at start: {loadavg()}")
        pairs = []
        try:
            for run in range(1, args.repeat + 1):
                label = f"run {run}/{args.repeat} " if args.repeat > 1 else ""
                profile = f"{args.profile}.{run}.txt" if args.profile else None
                pairs.append(pair(client, server.url, args.messages, label, profile))
            if args.workers > 1:
                fresh_group(client, "noop", "bench")
                pool, _ = run_consumer(client, server.url, args.messages, "--workers", str(args.workers))
                pool_rate = args.messages / pool
                label = f"(c) runconsumer --workers {args.workers}:"
                print(f"{label:<32}{pool_rate:>10,.0f} msgs/s (outside, {pool:.2f} s)")
                print(f"ratio c/b ({args.workers} workers / 1; (c) outside, with start-up, over (b) steady): "
                      f"{pool_rate / pairs[-1][1][0]:.2f}")
        finally:
            if hog:
                hog.terminate()
                hog.join()
        print(f"load at end: {loadavg()}")
        if args.repeat > 1:
            print_medians(pairs)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
