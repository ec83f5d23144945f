"""What tracing costs a consumer (issue 46): runconsumer's no-op handler in three tracing modes, alternated.

    .venv/bin/python bench/tracing.py [--messages 100000] [--repeat 3]

The modes (bench/tracing_settings.py): none (opentelemetry not importable), api (opentelemetry-api, no
tracer provider: the extra installed, nothing configured), sdk (the SDK with a BatchSpanProcessor and an
exporter that drops the spans: a CONSUMER span per message, extracted from its headers). Each message
carries a W3C traceparent header, as a traced producer's do, so every mode reads the same entries.
Figures: msgs/s and CPU µs per message in the consumer's steady state (bench/benchapp's ``noop:steady``,
from its first handled entry to its last), medians over the runs, and each mode's rate over none's.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys

from common import ROOT, at_least, positive, setup_django, start_redis, time_consumption
from throughput import loadavg, payload, rewind_group, steady_figures

MODES = ("none", "api", "sdk")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def consume(client, url, total, mode):
    """(msgs/s, CPU µs/msg) of ``runconsumer noop:steady`` in ``mode`` on ``total`` entries, steady state."""
    rewind_group(client, "noop", "steady")
    client.delete("bench:steady")
    env = {**os.environ, "REDIS_URL": url, "DJANGO_SETTINGS_MODULE": "bench.tracing_settings",
           "BENCH_TOTAL": str(total), "BENCH_OTEL": mode}
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "runconsumer", "noop:steady", "-v", "0"],
                            cwd=ROOT, env=env)
    try:
        time_consumption(client, "noop", "steady", total, pid=proc.pid)
        return steady_figures(client)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(60)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=at_least(10_000, " (the steady rate needs reads of 500 over a measurable time)"),
                        default=100_000)
    parser.add_argument("--repeat", type=positive, default=3, help="alternate the three modes N times; medians")
    args = parser.parse_args()
    server = start_redis()
    try:
        setup_django(server.url)
        from streams_app import publish_many

        client = server.client()
        for start in range(0, args.messages, 10_000):
            publish_many("noop", [payload(n, False) for n in range(start, min(args.messages, start + 10_000))],
                         headers={"traceparent": TRACEPARENT})
        print(f"published {args.messages} messages with a traceparent header to a private redis-server on port "
              f"{server.port}; load {loadavg()}")
        figures = {mode: [] for mode in MODES}
        for run in range(1, args.repeat + 1):
            for mode in MODES:
                rate, cpu = consume(client, server.url, args.messages, mode)
                figures[mode].append((rate, cpu))
                print(f"run {run}/{args.repeat} {mode:<5}{rate:>10,.0f} msgs/s  CPU {cpu:.2f} µs/msg  load {loadavg()}")
        none = statistics.median(rate for rate, _ in figures["none"])
        print(f"medians of {args.repeat} runs:")
        for mode in MODES:
            rate = statistics.median(r for r, _ in figures[mode])
            cpu = statistics.median(c for _, c in figures[mode])
            print(f"  {mode:<5}{rate:>10,.0f} msgs/s  CPU {cpu:.2f} µs/msg  {rate / none:.3f}x none")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
