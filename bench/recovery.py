"""Recovery after a worker dies: SIGKILL a runconsumer holding K messages mid-handler and time how
long a standby worker takes to handle all K, with default settings, with a short pending timeout, and with a short
consumer liveness TTL (the dead worker known dead before the pending timeout).

    .venv/bin/python bench/recovery.py [--messages 50] [--short-timeout-ms 2000]

The worker is killed as soon as it holds all K (their idle time is about 0, the worst case), and
the replacement worker is started right after the kill, as a supervisor would: the figure is the
takeover delay (pending timeout + up to one claim interval) plus the replacement's start-up, which
is printed on its own.
"""
import argparse
import json
import signal
import subprocess
import threading
import time

from common import manage, setup_django, start_redis


def wait(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)


def watch_for(proc, text, event):
    for line in proc.stdout:
        if text in line:
            event.set()


def run(server, client, messages, streams, label):
    client.flushall()
    env = {"SHOAL_TEST_STREAMS": json.dumps(streams), "DJANGO_SETTINGS_MODULE": "bench.settings"}
    from streams_app import publish_many

    publish_many("recovery", [{"n": n} for n in range(messages)])
    holder = manage("runconsumer", "recovery:bench", "--threads", str(-(-messages // 2)), "-v", "0",
                    redis_url=server.url, env=env)
    wait(lambda: client.exists("recovery") and client.xinfo_groups("recovery")
         and client.xinfo_groups("recovery")[0]["pending"] == messages, 60, "the first worker holding every message")
    holder.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    holder.wait(10)
    standby = manage("runconsumer", "recovery:bench", "-v", "1", redis_url=server.url, env=env,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    up = threading.Event()
    threading.Thread(target=watch_for, args=(standby, ": started (", up), daemon=True).start()
    up.wait(60)
    started = time.monotonic() - killed
    wait(lambda: client.llen("handled:recovery:bench") >= messages and client.xinfo_groups("recovery")[0]["pending"] == 0,
         300, "every message handled after the kill")
    seconds = time.monotonic() - killed
    standby.send_signal(signal.SIGTERM)
    standby.wait(60)
    handled = client.lrange("handled:recovery:bench", 0, -1)
    lost = messages - len(set(handled))
    print(f"{label:<48} {seconds:7.2f} s from SIGKILL to all {messages} handled "
          f"(replacement up after {started:.2f} s; lost {lost}, handled twice {len(handled) - len(set(handled))})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50, help="K: messages the killed worker holds")
    parser.add_argument("--short-timeout-ms", type=int, default=3000, help="PENDING_TIMEOUT_MS of the second run")
    args = parser.parse_args()
    server = start_redis()
    try:
        setup_django(server.url, settings="bench.settings")
        client = server.client()
        from streams_app.conf import get_settings

        defaults = get_settings()
        run(server, client, args.messages, {},
            f"defaults (pending {defaults['PENDING_TIMEOUT_MS']} ms, claim every {defaults['CLAIM_INTERVAL_MS']} ms)")
        short = {"PENDING_TIMEOUT_MS": args.short_timeout_ms, "CLAIM_INTERVAL_MS": max(100, args.short_timeout_ms // 4),
                 "BLOCK_MS": min(defaults["BLOCK_MS"], args.short_timeout_ms // 2)}
        run(server, client, args.messages, short,
            f"short (pending {short['PENDING_TIMEOUT_MS']} ms, claim every {short['CLAIM_INTERVAL_MS']} ms)")
        # Default pending timeout; the dead worker is found by its lapsed liveness deadline instead.
        alive = {"CONSUMER_TTL": 1.5, "CLAIM_INTERVAL_MS": 500}
        run(server, client, args.messages, alive,
            "liveness (consumer ttl 1.5 s, claim every 500 ms)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
