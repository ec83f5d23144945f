"""Service discovery figures, on a private redis-server.

    .venv/bin/python bench/discovery.py [--resolves 200000] [--repeat 50]

(a) DiscoveryClient.resolve() per second from the local cache, one thread, for each strategy
    (10 healthy instances, change-event listener on as in production);
(b) ServiceRegistry.instances() latency (one Lua round trip that prunes and reads every record)
    with 10 / 1,000 / 10,000 registered instances.
"""
import argparse
import logging
import statistics
import time

from common import setup_django, start_redis


def register_many(registry, service, count):
    for start in range(0, count, 500):
        pipe = registry.connection.pipeline(transaction=False)
        for n in range(start, min(count, start + 500)):
            registry.register(service, "10.0.0.1", 10000 + n % 50000, {"zone": "a", "weight": 1},
                              instance_id=f"{service}-{n}", pipeline=pipe)
        pipe.execute()


def bench_resolve(count):
    from discovery_app.balancers import STRATEGIES
    from discovery_app.client import DiscoveryClient
    from discovery_app.registry import ServiceRegistry

    register_many(ServiceRegistry(), "resolve-bench", 10)
    for name in STRATEGIES:
        client = DiscoveryClient(strategy=name, cache_ttl=3600)
        client.wait_listening()
        client.resolve("resolve-bench")  # fill the cache
        start = time.perf_counter()
        for _ in range(count):
            client.resolve("resolve-bench")
        elapsed = time.perf_counter() - start
        client.close()
        print(f"(a) resolve() from cache, {name:<22} {count / elapsed:>10,.0f} calls/s  ({elapsed * 1e6 / count:.1f} us/call)")


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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resolves", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    server = start_redis()
    try:
        setup_django(server.url)
        logging.getLogger("discovery_app").setLevel(logging.WARNING)
        print(f"private redis-server on port {server.port}")
        bench_resolve(args.resolves)
        bench_instances(args.repeat)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
