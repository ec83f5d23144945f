"""Tasks per second: Shoal's django.tasks backend against Shoal's own plain @consumer, one private Redis.

    .venv/bin/python bench/tasks.py [--tasks 4000] [--repeat 2]

For each kind of work, a no-op, a 1 ms sleep (an I/O wait, as a small call to another service) and
a 1 ms ``asyncio.sleep`` (``async def`` handler and task, on the worker's event loop), each rep times,
interleaved (plain, tasks, plain, tasks, ...):

- (p) plain: ``publish_many`` of N payloads, then one ``runconsumer`` of an ``@consumer`` handler
  doing that work (bench/benchapp/consumers.py);
- (t) tasks: N/2 ``my_task.enqueue(n)`` calls and one ``enqueue_many`` of N/2 (both rates are printed
  too), then one ``runconsumer``
  of the task's queue (``tasks:<queue>:workers``): each task writes RUNNING, runs, writes SUCCESSFUL.

Both are timed from outside the same way: from the first entry read by the group to the last one
acked. For tasks the rate from the results' own times (first ``started_at`` to last ``finished_at``)
is printed too: the measure the other backends get.

``--django-tasks-redis`` (a venv with Django 6 and django-tasks-redis; bench/README.md says how to make
one) adds, per rep, the same no-op task on django-tasks-redis (its ``run_redis_tasks`` worker, which
exits once its queue is empty, on the same Redis), timed from its results' first ``started_at`` to last
``finished_at``, and its enqueue rate, beside the Shoal figures of the same rep.

``--others`` (run with a venv that has django-tasks-db and django-tasks-rq, e.g.
``/tmp/benchvenv/bin/python bench/tasks.py --others``) adds, per rep, the same no-op task on
django-tasks-db (``db_worker``, a SQLite file of its own) and django-tasks-rq (``rqworker --burst`` on
the same Redis), timed from their results' first ``started_at`` to last ``finished_at``. Default settings (THREADS 4, BATCH_SIZE 500), one consumer process each. Each
rep adds N entries to the same streams, read by the same groups (deleting a stream would have the
consumers wait out the lost-group protocol's settling time).
"""
import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import time

from common import cpu_seconds, group_progress, manage, setup_django, start_redis

SETTINGS = "bench.tasks_settings"
OTHERS_SETTINGS = "bench.tasks_others_settings"
DTR_SETTINGS = "bench.tasks_dtr_settings"
KINDS = {
    # kind: (plain stream, task name, task queue)
    "no-op": ("tasks_noop", "noop", "bnoop"),
    "1 ms sleep": ("tasks_sleep", "sleep_1ms", "bsleep"),
    "async 1 ms": ("tasks_sleep_async", "sleep_1ms_async", "bsleep"),  # async def both: the event loop
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
    from asgiref.sync import iscoroutinefunction

    from streams_app.tasks import messages

    is_async = iscoroutinefunction(task.func)
    stream = messages.async_stream_name(queue) if is_async else messages.stream_name(queue)
    base = group_progress(client, stream, messages.GROUP)[0] if client.exists(stream) else 0
    from streams_app.tasks import enqueue_many

    half = total // 2
    started = time.perf_counter()
    ids = [task.enqueue(n).id for n in range(half)]
    enqueue_rate = half / (time.perf_counter() - started)
    started = time.perf_counter()
    ids += [result.id for result in enqueue_many(task, [((n,), {}) for n in range(half, total)])]
    bulk_rate = (total - half) / (time.perf_counter() - started)
    proc = manage("runconsumer", f"{stream}:{messages.GROUP}", "-v", "0", redis_url=url,
                  env={"DJANGO_SETTINGS_MODULE": SETTINGS})
    seconds, cpu = finish(client, proc, stream, messages.GROUP, base, total)
    from streams_app.tasks import results

    return seconds, cpu, (enqueue_rate, bulk_rate), own_rate(results.many(client, ids))


def own_rate(records):
    """Tasks per second from the results' own times: first start to last finish."""
    first = min(r["started_at"] for r in records)
    last = max(r["finished_at"] for r in records)
    return len(records) / (last - first).total_seconds()


def db_tasks(url, total):
    """django-tasks-db: enqueue ``total`` no-op tasks, run ``db_worker`` until they are SUCCESSFUL."""
    from django_tasks_db.models import DBTaskResult

    from bench.benchapp import other_tasks

    started = time.perf_counter()
    ids = [other_tasks.db_noop.enqueue(n).id for n in range(total)]
    enqueue_rate = total / (time.perf_counter() - started)
    proc = manage("db_worker", "--queue-name", "dbnoop", "--backend", "db", "--interval", "0.05",
                  "--no-startup-delay", redis_url=url, env={"DJANGO_SETTINGS_MODULE": SETTINGS})
    try:
        deadline = time.monotonic() + 120
        while DBTaskResult.objects.filter(id__in=ids, status="SUCCESSFUL").count() < total:
            if time.monotonic() > deadline:
                raise TimeoutError("db_worker did not finish in 120 s")
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    rows = DBTaskResult.objects.filter(id__in=ids).values("started_at", "finished_at")
    return own_rate(list(rows)), enqueue_rate


def rq_tasks(url, total):
    """django-tasks-rq: enqueue ``total`` no-op tasks, run ``rqworker --burst`` (it exits once the queue is empty)."""
    from bench.benchapp import other_tasks

    started = time.perf_counter()
    ids = [other_tasks.rq_noop.enqueue(n).id for n in range(total)]
    enqueue_rate = total / (time.perf_counter() - started)
    # django-tasks-rq's Job runs the Task's function and writes its result (its README's worker command).
    proc = manage("rqworker", "rqnoop", "--burst", "--job-class", "django_tasks_rq.backend.Job", redis_url=url, env={"DJANGO_SETTINGS_MODULE": SETTINGS},
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert proc.wait(120) == 0
    found = [other_tasks.rq_noop.get_result(i) for i in ids]
    assert all(r.status == "SUCCESSFUL" for r in found), found[0].errors[-1].traceback[-1500:] if found[0].errors else found[0].status
    return own_rate([{"started_at": r.started_at, "finished_at": r.finished_at} for r in found]), enqueue_rate


def dtr_tasks(url, total):
    """django-tasks-redis: enqueue ``total`` no-op tasks, run ``run_redis_tasks`` (it exits once the queue is empty)."""
    from bench.benchapp import peer_tasks

    started = time.perf_counter()
    ids = [peer_tasks.dtr_noop.enqueue(n).id for n in range(total)]
    enqueue_rate = total / (time.perf_counter() - started)
    proc = manage("run_redis_tasks", "--backend", "dtr", "--queue", "dtrnoop", redis_url=url,
                  env={"DJANGO_SETTINGS_MODULE": SETTINGS}, stdout=subprocess.DEVNULL)
    assert proc.wait(300) == 0
    found = [peer_tasks.dtr_noop.get_result(i) for i in ids]
    assert all(r.status == "SUCCESSFUL" for r in found), found[0].status
    return own_rate([{"started_at": r.started_at, "finished_at": r.finished_at} for r in found]), enqueue_rate


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--others", action="store_true",
                        help="also django-tasks-db and django-tasks-rq (a venv with both installed)")
    parser.add_argument("--django-tasks-redis", action="store_true",
                        help="also django-tasks-redis (a venv with Django 6 and django-tasks-redis)")
    parser.add_argument("--others-tasks", type=int, default=1000, help="tasks per run of the other backends")
    args = parser.parse_args()
    global SETTINGS
    if args.others and args.django_tasks_redis:
        parser.error("--others and --django-tasks-redis need different venvs: give one of them")
    if args.django_tasks_redis:
        SETTINGS = DTR_SETTINGS
    if args.others:
        SETTINGS = OTHERS_SETTINGS
    if args.others or args.django_tasks_redis:
        os.environ["BENCH_TASKS_DB"] = os.path.join(tempfile.mkdtemp(prefix="shoal-bench-tasks-"), "db.sqlite3")
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    server = start_redis()
    try:
        setup_django(server.url, SETTINGS)
        from bench.benchapp import tasks as bench_tasks

        if args.others:
            assert manage("migrate", "-v", "0", redis_url=server.url, env={"DJANGO_SETTINGS_MODULE": SETTINGS}).wait(120) == 0

        client = server.client()
        total = args.tasks
        print(f"{total} per run, {args.repeat} reps, private redis-server on port {server.port}, "
              f"load {os.getloadavg()[0]:.1f}")
        ratios = {kind: [] for kind in KINDS}
        for rep in range(1, args.repeat + 1):
            for kind, (stream, task_name, queue) in KINDS.items():
                p_seconds, p_cpu = plain(client, server.url, stream, total)
                t_seconds, t_cpu, enqueue_rate, t_own = tasks(client, server.url, getattr(bench_tasks, task_name), queue,
                                                              total)
                p_rate, t_rate = total / p_seconds, total / t_seconds
                ratios[kind].append(t_rate / p_rate)
                print(f"rep {rep} {kind:<11} (p) @consumer {p_rate:>8,.0f}/s (CPU {p_cpu / total * 1e6:5.0f} µs each)"
                      f"  (t) tasks {t_rate:>8,.0f}/s (CPU {t_cpu / total * 1e6:5.0f} µs each)  t/p {t_rate / p_rate:.2f}"
                      f"  enqueue {enqueue_rate[0]:,.0f}/s  enqueue_many {enqueue_rate[1]:,.0f}/s"
                      f"  (t) by its results' times {t_own:,.0f}/s"
                      f"  load {os.getloadavg()[0]:.1f}")
            others = ((("django-tasks-db", db_tasks), ("django-tasks-rq", rq_tasks)) if args.others else
                      (("django-tasks-redis", dtr_tasks),) if args.django_tasks_redis else ())
            if others:
                for name, run in others:
                    rate, enqueue_rate = run(server.url, args.others_tasks)
                    print(f"rep {rep} no-op       {name}: {rate:>8,.0f}/s by its results' times"
                          f"  ({args.others_tasks} tasks)  enqueue {enqueue_rate:,.0f}/s  load {os.getloadavg()[0]:.1f}")
        for kind, values in ratios.items():
            print(f"{kind}: t/p {' '.join(f'{r:.2f}' for r in values)}  median {statistics.median(values):.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
