"""The payload codecs: encoding and decoding costs per message, and the publish rate, per engine.

    .venv/bin/python bench/codec.py [--messages 100000]

(a) ``encode_message`` (what publish does before Redis) and (b) ``Message.payload`` (what a consumer
does before the handler), in microseconds per message, for four payloads: small and ~10 kB, plain and
typed (datetimes, Decimals, UUIDs), in CPU time of this process. (c) ``publish_many`` of --messages small payloads to a private
redis-server, messages per second (Redis round trips included).
"""
import argparse
import datetime
import decimal
import os
import time
import uuid

from common import setup_django, start_redis

NOW = datetime.datetime(2026, 11, 30, 20, 29, 11, 364826, tzinfo=datetime.UTC)


def payloads():
    small = {"n": 1, "customer": "ACME", "pad": "x" * 40}
    small_typed = {"n": 1, "at": NOW, "total": decimal.Decimal("9.99"), "id": uuid.UUID(int=1)}
    lines = [{"sku": f"SKU-{i}", "qty": i, "price": 12.5, "name": "a product name " * 3} for i in range(60)]
    order = {"id": 1, "customer": {"name": "ACME", "city": "Paris"}, "lines": lines, "note": None}
    typed_lines = [{"sku": f"SKU-{i}", "qty": i, "price": decimal.Decimal("12.50"), "at": NOW, "name": "a product name " * 3}
                   for i in range(60)]
    order_typed = {"id": uuid.UUID(int=2), "customer": {"name": "ACME", "city": "Paris"}, "lines": typed_lines, "note": None}
    return {"small plain": small, "small typed": small_typed, "10 kB plain": order, "10 kB typed": order_typed}


def per_message(fn, rounds=7, calls=200):
    """CPU µs per call (this process's CPU time, not the wall clock: the machine may be shared), best round."""
    runs = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(calls):
            fn()
        runs.append((time.process_time() - start) / calls * 1e6)
    return min(runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args()
    os.environ.setdefault("SHOAL_TEST_STREAMS", "{}")
    server = start_redis()
    try:
        setup_django(server.url)
        from streams_app import publish_many
        from streams_app.publishing.message import Message
        from streams_app.publishing.encoding import encode_message
        from django.test import override_settings
        from django.conf import settings

        engines = ["json", "orjson"]
        print(f"{'payload':<14}{'bytes':>7}" + "".join(f"{f'(a) encode {e}':>18}{f'(b) decode {e}':>18}" for e in engines))
        for name, payload in payloads().items():
            row = ""
            for engine in engines:
                with override_settings(STREAMS={**settings.STREAMS, "CODEC": engine}):
                    fields = encode_message(payload)
                    raw = {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in fields.items()}
                    encode_us = per_message(lambda p=payload: encode_message(p))
                    decode_us = per_message(lambda r=raw: Message("1-0", "s", "g", r).payload)
                row += f"{encode_us:>16.2f}µs{decode_us:>16.2f}µs"
            print(f"{name:<14}{len(fields['payload']):>7}{row}")
        client = server.client()
        for engine in engines:
            with override_settings(STREAMS={**settings.STREAMS, "CODEC": engine}):
                for typed in (False, True):
                    stream = f"bench-{engine}-{typed}"
                    make = payloads()["small typed" if typed else "small plain"]
                    batch = [dict(make, n=n) for n in range(10_000)]
                    start, cpu = time.perf_counter(), time.process_time()
                    for _ in range(0, args.messages, 10_000):
                        publish_many(stream, batch)
                    took, cpu = time.perf_counter() - start, time.process_time() - cpu
                    client.delete(stream)
                    kind = "typed" if typed else "plain"
                    print(f"(c) publish_many, {engine:<6} small {kind}: {args.messages / took:>10,.0f} msgs/s, "
                          f"publisher CPU {cpu / args.messages * 1e6:.2f} µs/msg")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
