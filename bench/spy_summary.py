"""Where a profiled consumer's time went: a summary of py-spy's raw output, thread by thread.

    .venv/bin/python bench/spy_summary.py PROFILE.txt [--top 25] [--messages N]

PROFILE.txt is what ``bench/throughput.py --profile PREFIX`` wrote (py-spy record --threads -f raw,
active samples only). Start-up (imports, django.setup, command parsing) is left out: samples whose
stack passes through the import machinery or Django's setup. For each thread: its active samples, then
the functions that the samples were in (self) and passed through (inclusive, Shoal and redis-py only),
as a share of the thread's samples. With ``--messages``, samples per 1,000 messages too.
"""
import argparse
import collections
import re

STARTUP = re.compile(r"_find_and_load|django/__init__.py|setup \(django|<module> \(manage.py:\d+\);main \(manage.py:\d+\);execute_from_command_line \([^;]*\);(?!.*run_from_argv)")
WANTED = re.compile(r"streams_app/|redis/|hiredis|concurrent/futures|threading.py|queue.py|json|orjson")


def frame_name(frame):
    return re.sub(r" \(([^:]*):\d+\)$", r" (\1)", frame)  # one row per function, not per line


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--messages", type=int)
    args = parser.parse_args()
    threads = collections.defaultdict(lambda: (collections.Counter(), collections.Counter()))
    totals = collections.Counter()
    for line in open(args.profile):
        stack, count = line.rsplit(" ", 1)
        if STARTUP.search(stack):
            continue
        thread, *frames = stack.split(";")
        name = re.sub(r"thread \(\d+\):? ?", "", thread) or "(unnamed)"
        name = re.sub(r"_\d+$", "_N", name)  # the handler threads together
        count = int(count)
        totals[name] += count
        own, through = threads[name]
        if frames:
            own[frame_name(frames[-1])] += count
        for frame in {frame_name(f) for f in frames}:
            through[frame] += count
    for name, total in totals.most_common():
        own, through = threads[name]
        per = f", {total * 1000 / args.messages:.2f} per 1,000 messages" if args.messages else ""
        print(f"\n== {name}: {total} active samples{per}")
        print("  self:")
        for frame, n in own.most_common(args.top):
            print(f"    {n / total:6.1%}  {frame}")
        print("  inclusive (Shoal, redis-py, threads, json):")
        rows = [(frame, n) for frame, n in through.most_common() if WANTED.search(frame)]
        for frame, n in rows[:args.top]:
            print(f"    {n / total:6.1%}  {frame}")


if __name__ == "__main__":
    main()
