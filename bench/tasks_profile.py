"""Where a task's time goes: the sync queue handler over N no-op tasks in this one thread, one private Redis.

    .venv/bin/python bench/tasks_profile.py [--tasks 2000] [--chunk 50] [--per-task] [--profile wall|cpu]

Enqueues N ``bench.benchapp.tasks.noop`` tasks, then runs them as a worker's handler thread does:
``run_chunk(QueueHandler(alias), chunk)`` over chunks of ``--chunk`` messages (``--per-task``: the
plain ``run_message`` per message, each result written on its own). Prints wall and CPU time per task,
the Redis commands per 1,000 tasks (``INFO commandstats``: the commands a script runs count too, the
round trips are the EVALSHA/MULTI/single commands), and with ``--profile`` the top of a cProfile,
by wall or CPU time. No reads or acks: those are the consumer's, the same as for a plain @consumer.
"""
import argparse
import cProfile
import os
import pstats
import time

from common import setup_django, start_redis

SETTINGS = "bench.tasks_settings"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--chunk", type=int, default=50)
    parser.add_argument("--per-task", action="store_true", help="run_message per message, no chunk")
    parser.add_argument("--profile", choices=("wall", "cpu"))
    args = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    server = start_redis()
    try:
        setup_django(server.url, SETTINGS)
        from bench.benchapp import tasks as bench_tasks
        from streams_app.consuming.chunks import run_chunk
        from streams_app.publishing.message import Message
        from streams_app.tasks import messages
        from streams_app.tasks.runner import QueueHandler, run_message

        client = server.client()
        for n in range(args.tasks + 2):
            bench_tasks.noop.enqueue(n)
        stream = messages.stream_name("bnoop")
        queued = [Message(entry_id, stream, messages.GROUP, fields, 1, "bench-1") for entry_id, fields in client.xrange(stream)]
        warm, queued = queued[:2], queued[2:]
        run_chunk(QueueHandler("default"), warm)  # loads the scripts
        client.config_resetstat()
        profiler = cProfile.Profile(time.process_time) if args.profile == "cpu" else cProfile.Profile()
        wall, cpu = time.perf_counter(), time.process_time()
        if args.profile:
            profiler.enable()
        if args.per_task:
            for message in queued:
                run_message("default", message)
        else:
            handler = QueueHandler("default")
            for start in range(0, len(queued), args.chunk):
                run_chunk(handler, queued[start:start + args.chunk])
        if args.profile:
            profiler.disable()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        total = len(queued)
        print(f"{total} no-op tasks, {'run_message per task' if args.per_task else f'chunks of {args.chunk}'}"
              f"{', profiled' if args.profile else ''}: {wall / total * 1e6:.0f} µs wall, {cpu / total * 1e6:.0f} µs CPU "
              f"per task, load {os.getloadavg()[0]:.1f}")
        stats = client.info("commandstats")
        for name, found in sorted(stats.items(), key=lambda item: -item[1]["calls"]):
            if name != "cmdstat_config|resetstat":
                print(f"  {name[8:]:<14} {found['calls'] * 1000 / total:6.0f} per 1,000 tasks")
        if args.profile:
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
