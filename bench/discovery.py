"""Service discovery figures, on a private redis-server.

    .venv/bin/python bench/discovery.py [--resolves 200000] [--repeat 50] [--weights equal|unequal|both]
                                        [--sections abcde]

(a) DiscoveryClient.resolve() per second from the local cache, one thread, for each strategy
    (10 / 1,000 / 10,000 healthy instances, change-event listener on as in production), with every
    weight 1 and with unequal weights (1 to 4: round-robin's weighted schedule, the others' weighted draws);
(b) ServiceRegistry.instances() latency (one Lua round trip that prunes and reads every record)
    with 10 / 1,000 / 10,000 registered instances;
(c) asyncio: aresolve() per second from the cache (on the loop), and request() calls per second to
    a local HTTP server through asyncio.to_thread with 16 tasks, against the same calls from one thread
    (what an httpx client would have to beat to be worth a second HTTP stack);
(d) the time from a registration to a client resolving it, at 10,000 instances;
(e) a full read of 10,000 instances against an incremental read of one change since (alternating).
"""
import argparse
import asyncio
import logging
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from common import setup_django, start_redis


def register_many(registry, service, count, weight=lambda n: 1):
    for start in range(0, count, 500):
        pipe = registry.connection.pipeline(transaction=False)
        for n in range(start, min(count, start + 500)):
            registry.register(service, "10.0.0.1", 10000 + n % 50000, {"zone": "a", "weight": weight(n)},
                              instance_id=f"{service}-{n}", pipeline=pipe)
        pipe.execute()


WEIGHTS = {"equal": lambda n: 1, "unequal": lambda n: 1 + n % 4}


def bench_resolve(count, weights="equal"):
    from discovery_app.balancers import STRATEGIES
    from discovery_app.client import DiscoveryClient
    from discovery_app.registry import ServiceRegistry

    registry = ServiceRegistry(ttl=3600)
    for size in (10, 1_000, 10_000):
        service = f"resolve-bench-{weights}-{size}"
        register_many(registry, service, size, WEIGHTS[weights])
        for name in STRATEGIES:
            client = DiscoveryClient(strategy=name, cache_ttl=3600)
            client.wait_listening()
            client.resolve(service)  # fill the cache
            calls = count
            start = time.perf_counter()
            for _ in range(calls):
                client.resolve(service)
            elapsed = time.perf_counter() - start
            print(f"(a) resolve() from cache, {size:>6,} instances, {weights} weights, {name:<22} "
                  f"{calls / elapsed:>10,.0f} calls/s  ({elapsed * 1e6 / calls:.1f} us/call)")
            if name in ("least-connections", "power-of-two-choices"):
                # What a threaded web worker sees: a few calls of its own in flight.
                busy = [client.resolve(service) for _ in range(8)]
                for instance in busy:
                    client._inflight[instance.instance_id] += 1
                start = time.perf_counter()
                for _ in range(count):
                    client.resolve(service)
                elapsed = time.perf_counter() - start
                print(f"(a) resolve() from cache, {size:>6,} instances, {weights} weights, {name:<22} "
                      f"{count / elapsed:>10,.0f} calls/s  ({elapsed * 1e6 / count:.1f} us/call) with 8 calls in flight")
            client.close()


def bench_change_at_scale(size=10_000, repeat=5):
    """From a registration at ``size`` instances to a client resolving the new instance."""
    from discovery_app.client import DiscoveryClient
    from discovery_app.registry import ServiceRegistry

    registry = ServiceRegistry(ttl=3600)
    service = f"change-bench-{size}"
    register_many(registry, service, size)
    client = DiscoveryClient(cache_ttl=3600)
    client.wait_listening()
    client.resolve(service)
    samples = []
    for n in range(repeat):
        start = time.perf_counter()
        new = registry.register(service, "10.9.9.9", 9000 + n)
        while new.instance_id not in {i.instance_id for i in client.instances(service)}:
            time.sleep(0.001)
        samples.append((time.perf_counter() - start) * 1000)
    client.close()
    print(f"(d) a registration reaching a client at {size:,} instances: median {statistics.median(samples):.0f} ms "
          f"(max {max(samples):.0f} ms, {repeat} runs; the client reads only what changed)")


def bench_incremental(size=10_000, repeat=7):
    from discovery_app.registry import ServiceRegistry

    registry = ServiceRegistry(ttl=3600)
    service = f"incremental-{size}"
    register_many(registry, service, size)
    full, changes = [], []
    for n in range(repeat):
        start = time.perf_counter()
        read = registry.read(service)
        full.append((time.perf_counter() - start) * 1000)
        registry.register(service, "10.9.9.9", 9000 + n, instance_id=f"{service}-new-{n}")
        start = time.perf_counter()
        found = registry.read_changes(service, read.position, window=31)
        changes.append((time.perf_counter() - start) * 1000)
        assert found is not None and len(found.changed) == 1
    print(f"(e) at {size:,} instances: full read median {statistics.median(full):.1f} ms, read of one change "
          f"since median {statistics.median(changes):.2f} ms ({repeat} alternating runs)")


def bench_instances(repeat):
    from discovery_app.registry import ServiceRegistry

    registry = ServiceRegistry(ttl=3600)
    for size in (10, 1_000, 10_000):
        service = f"list-{size}"
        register_many(registry, service, size)
        assert len(registry.instances(service)) == size
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            registry.instances(service)
            samples.append((time.perf_counter() - start) * 1000)
        samples.sort()
        p95 = samples[int(len(samples) * 0.95) - 1]
        print(f"(b) instances() with {size:>6,} instances: median {statistics.median(samples):8.2f} ms, "
              f"p95 {p95:8.2f} ms  ({repeat} calls)")


def bench_async(count, calls):
    from discovery_app.client import DiscoveryClient
    from discovery_app.registry import ServiceRegistry

    register_many(ServiceRegistry(), "async-bench", 10)
    client = DiscoveryClient(cache_ttl=3600)
    client.resolve("async-bench")

    async def resolves():
        start = time.perf_counter()
        for _ in range(count):
            await client.aresolve("async-bench")
        return time.perf_counter() - start

    elapsed = asyncio.run(resolves())
    print(f"(c) aresolve() from cache on the loop      {count / elapsed:>10,.0f} calls/s  ({elapsed * 1e6 / count:.1f} us/call)")

    class Hello(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            if self.path == "/slow":
                time.sleep(0.02)  # an instance 20 ms away
            # One write: headers and body in separate segments meet delayed ACKs (40 ms a call).
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    ServiceRegistry(ttl=3600).register("hello", "127.0.0.1", httpd.server_address[1])
    client.request("hello", "GET", "/")

    async def threaded(path, n, tasks=16):
        async def worker(n):
            for _ in range(n):
                await asyncio.to_thread(client.request, "hello", "GET", path)

        start = time.perf_counter()
        await asyncio.gather(*(worker(n // tasks) for _ in range(tasks)))
        return time.perf_counter() - start

    for path, n in (("/", calls), ("/slow", calls // 10)):
        start = time.perf_counter()
        for _ in range(n):
            client.request("hello", "GET", path)
        sync = time.perf_counter() - start
        threaded_elapsed = asyncio.run(threaded(path, n))
        print(f"(c) GET {path:<6} request(), one thread       {n / sync:>10,.0f} calls/s")
        print(f"(c) GET {path:<6} to_thread(request) x16      {n / threaded_elapsed:>10,.0f} calls/s")
    httpd.shutdown()
    client.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resolves", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--weights", choices=("equal", "unequal", "both"), default="both",
                        help="section (a): every weight 1, weights 1 to 4, or both")
    parser.add_argument("--sections", default="abcde", help="which sections to run, e.g. a")
    args = parser.parse_args()
    server = start_redis()
    try:
        setup_django(server.url)
        from django.conf import settings

        # A full read of 10,000 instances can take over the default 1 s on a loaded machine; the
        # bench measures it rather than serving stale answers.
        settings.DISCOVERY = {**getattr(settings, "DISCOVERY", {}), "REDIS_TIMEOUT": 10.0}
        logging.getLogger("discovery_app").setLevel(logging.WARNING)
        print(f"private redis-server on port {server.port}")
        if "a" in args.sections:
            for weights in ("equal", "unequal") if args.weights == "both" else (args.weights,):
                bench_resolve(args.resolves, weights)
        if "b" in args.sections:
            bench_instances(args.repeat)
        if "c" in args.sections:
            bench_async(args.resolves // 4, args.calls)
        if "d" in args.sections:
            bench_change_at_scale()
        if "e" in args.sections:
            bench_incremental()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
