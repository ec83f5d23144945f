"""Idempotency keys that are not valid UTF-8, with real ``manage.py runconsumer`` processes (issue 32, F5).

A foreign producer may XADD any bytes as ``key`` (or ``shoal:idempotency_id``). Decoded with U+FFFD
for bad bytes, ``a\\xff``, ``a\\xfe`` and a published ``a\\ufffd`` were one guard key, and the guards
acked the later ones without running them. The guard key is made from the bytes: bytes that are not
UTF-8 are stored hashed (``sha256:<hex>`` of the bytes, as NUL-bearing and long keys already were),
valid UTF-8 keeps its stored form, so the marks and rows of a deployment still match after an upgrade.
"""
import hashlib
import json
import signal
from collections import Counter

import pytest

from streams_app import publish
from tests.entries import listed
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


def hashed(raw):
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def xadd(redis, stream, name, **fields):
    return redis.xadd(stream, {"payload": json.dumps({"name": name}), **fields})


def publish_keyed(redis, stream):
    """The entries of both tests, each with a key of its own: {name: entry id}."""
    return {
        "ff": xadd(redis, stream, "ff", key=b"a\xff"),
        "fe": xadd(redis, stream, "fe", key=b"a\xfe"),
        "replacement": publish(stream, {"name": "replacement"}, key="a\ufffd"),
        # shoal:idempotency_id wins over key: two ids that are not UTF-8 under one shared key.
        "id-ff": xadd(redis, stream, "id-ff", key="shared", **{"shoal:idempotency_id": b"i\xff"}),
        "id-fe": xadd(redis, stream, "id-fe", key="shared", **{"shoal:idempotency_id": b"i\xfe"}),
        "plain": publish(stream, {"name": "plain"}, key="order-1"),
        "long": publish(stream, {"name": "long"}, key="k" * 201),  # hashed from its UTF-8, as before
    }


def publish_again(redis, stream):
    """Once the first ones are handled, the same keys again (the same bytes, raw): duplicates."""
    return [publish(stream, {"name": "plain-again"}, key="order-1"), xadd(redis, stream, "ff-again", key=b"a\xff"),
            xadd(redis, stream, "id-ff-again", key="other", **{"shoal:idempotency_id": b"i\xff"})]


def wait_all_acked(redis, stream, group, count):
    def done():
        infos = redis.xinfo_groups(stream)  # none until the consumer has made its group
        return any(info["name"] == group and info["entries-read"] == count and info["pending"] == 0
                   and info["lag"] == 0 for info in infos)

    wait_for(done, timeout=30, what=f"all {count} entries read and acked by {stream}:{group}")


def test_keys_that_are_not_utf8_each_run_once_under_the_redis_guard(redis, run_consumer):
    ids = publish_keyed(redis, "idem")
    proc = run_consumer("idem:r")
    wait_all_acked(redis, "idem", "r", len(ids))
    publish_again(redis, "idem")
    wait_all_acked(redis, "idem", "r", len(ids) + 3)
    assert Counter(listed(redis, "started", "idem", "r")) == {entry: 1 for entry in ids.values()}
    marks = {hashed(b"a\xff"), hashed(b"a\xfe"), "a\ufffd", hashed(b"i\xff"), hashed(b"i\xfe"), "order-1",
             hashed(b"k" * 201)}
    assert {key: redis.get(f"{{idem}}:idem:r:{key}") for key in marks} == dict.fromkeys(marks, "done")
    assert redis.xlen("{idem}:dlq") == 0
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()


def test_keys_that_are_not_utf8_each_run_once_under_the_db_guard(redis, run_consumer, process_database):
    ids = publish_keyed(redis, "dbjobs")
    proc = run_consumer("dbjobs:d", env={"DATABASE_URL": process_database.url})
    wait_all_acked(redis, "dbjobs", "d", len(ids))
    publish_again(redis, "dbjobs")
    wait_all_acked(redis, "dbjobs", "d", len(ids) + 3)
    assert Counter(listed(redis, "started", "dbjobs", "d")) == {entry: 1 for entry in ids.values()}
    effects = process_database.rows("SELECT name, entry_id FROM testapp_effect")
    assert sorted(effects) == sorted((name, entry) for name, entry in ids.items())
    rows = process_database.rows("SELECT key, entry_id FROM streams_app_processedmessage")
    assert sorted(rows) == sorted([(hashed(b"a\xff"), ids["ff"]), (hashed(b"a\xfe"), ids["fe"]),
                                   ("a\ufffd", ids["replacement"]), (hashed(b"i\xff"), ids["id-ff"]),
                                   (hashed(b"i\xfe"), ids["id-fe"]), ("order-1", ids["plain"]),
                                   (hashed(b"k" * 201), ids["long"])])
    assert redis.xlen("{dbjobs}:dlq") == 0
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()
