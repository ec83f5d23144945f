"""Tasks per second: Shoal's django.tasks backend against Shoal's own plain @consumer, one private Redis.

    .venv/bin/python bench/tasks.py [--tasks 4000] [--repeat 2]

For each kind of work, a no-op and a 1 ms sleep (an I/O wait, as a small call to another service),
each rep times, interleaved (plain, tasks, plain, tasks, ...):

- (p) plain: ``publish_many`` of N payloads, then one ``runconsumer`` of an ``@consumer`` handler
  doing that work (bench/benchapp/consumers.py);
- (t) tasks: N ``my_task.enqueue(n)`` calls (the enqueue rate is printed too), then one ``runconsumer``
  of the task's queue (``tasks:<queue>:workers``): each task writes RUNNING, runs, writes SUCCESSFUL.

Both are timed from outside the same way (bench/common.py): from the first entry read by the group to
the last one acked. Default settings (THREADS 4, BATCH_SIZE 500), one consumer process each. Each
rep adds N entries to the same streams, read by the same groups (deleting a stream would have the
consumers wait out the lost-group protocol's settling time).
"""
import argparse
import os
import signal
import statistics
import time

from common import cpu_seconds, group_progress, manage, setup_django, start_redis

SETTINGS = "bench.tasks_settings"
KINDS = {
    # kind: (plain stream, task name, task queue)
    "no-op": ("tasks_noop", "noop", "bnoop"),
    "1 ms sleep": ("tasks_sleep", "sleep_1ms", "bsleep"),
}


def timed(client, stream, group, base, total, pid, timeout=120):
    """(seconds, CPU seconds of ``pid``) from the first of the ``total`` entries after the ``base`` the
    group had read being read to the last one acked, polled every 2 ms."""
    deadline = time.monotonic() + timeout
    start = cpu_start = None
    while time.monotonic() < deadline:
        read, pending = group_progress(client, stream, group)
        now = time.monotonic()
        if start is None and read > base:
            start, cpu_start = now, cpu_seconds(pid)
        if read >= base + total and pending == 0:
            return now - start, cpu_seconds(pid) - cpu_start
        time.sleep(0.002)
    raise TimeoutError(f"{group} did not consume {total} entries of {stream} in {timeout}s")


def finish(client, proc, stream, group, base, total):
    try:
        return timed(client, stream, group, base, total, proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def plain(client, url, stream, total):
    from streams_app import publish_many

    base = group_progress(client, stream, "bench")[0] if client.exists(stream) else 0
    publish_many(stream, [{"n": n} for n in range(total)])
    proc = manage("runconsumer", f"{stream}:bench", "-v", "0", redis_url=url, env={"DJANGO_SETTINGS_MODULE": SETTINGS})
    return finish(client, proc, stream, "bench", base, total)


def tasks(client, url, task, queue, total):
    from streams_app.tasks import messages

    stream = messages.stream_name(queue)
    base = group_progress(client, stream, messages.GROUP)[0] if client.exists(stream) else 0
    started = time.perf_counter()
    for n in range(total):
        task.enqueue(n)
    enqueue_rate = total / (time.perf_counter() - started)
    proc = manage("runconsumer", messages.selector(queue), "-v", "0", redis_url=url,
                  env={"DJANGO_SETTINGS_MODULE": SETTINGS})
    seconds, cpu = finish(client, proc, stream, messages.GROUP, base, total)
    return seconds, cpu, enqueue_rate


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    server = start_redis()
    try:
        setup_django(server.url, SETTINGS)
        from bench.benchapp import tasks as bench_tasks

        client = server.client()
        total = args.tasks
        print(f"{total} per run, {args.repeat} reps, private redis-server on port {server.port}, "
              f"load {os.getloadavg()[0]:.1f}")
        ratios = {kind: [] for kind in KINDS}
        for rep in range(1, args.repeat + 1):
            for kind, (stream, task_name, queue) in KINDS.items():
                p_seconds, p_cpu = plain(client, server.url, stream, total)
                t_seconds, t_cpu, enqueue_rate = tasks(client, server.url, getattr(bench_tasks, task_name), queue, total)
                p_rate, t_rate = total / p_seconds, total / t_seconds
                ratios[kind].append(t_rate / p_rate)
                print(f"rep {rep} {kind:<11} (p) @consumer {p_rate:>8,.0f}/s (CPU {p_cpu / total * 1e6:5.0f} µs each)"
                      f"  (t) tasks {t_rate:>8,.0f}/s (CPU {t_cpu / total * 1e6:5.0f} µs each)  t/p {t_rate / p_rate:.2f}"
                      f"  enqueue {enqueue_rate:,.0f}/s  load {os.getloadavg()[0]:.1f}")
        for kind, values in ratios.items():
            print(f"{kind}: t/p {' '.join(f'{r:.2f}' for r in values)}  median {statistics.median(values):.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
