"""Text that Redis or PostgreSQL cannot hold as it is, with real ``manage.py runconsumer`` processes
(issue 32, items 1 and 3).

A lone surrogate is what ``os.fsdecode()`` gives for a file name that is not UTF-8, so a handler's
``raise ValueError(f"cannot parse {name}")`` is ordinary code. Redis takes UTF-8 only: the worker
must store such text escaped (``\\udcff``), retry and dead-letter the entry as any other, and go on.
A message key may hold NUL, which PostgreSQL text cannot: the db guard stores it hashed.
"""
import hashlib
import os
import signal
from collections import Counter

import pytest

from streams_app import publish
from tests.entries import listed, publish_raw
from tests.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stream", ["raises", "araises", "raisesr"])  # sync, async, idempotent="redis"
def test_a_lone_surrogate_in_an_error_is_stored_escaped_and_the_worker_goes_on(redis, run_consumer, stream):
    payloads = [{"n": n} for n in range(20)]
    payloads[0] = {"raise": "Surrogate"}
    payloads[7] = {"raise": "SurrogateTraceback"}
    ids = publish_raw(redis, stream, payloads)
    bad = {ids[0], ids[7]}
    proc = run_consumer(f"{stream}:g", "--workers", "1", "--threads", "2")
    wait_for(lambda: redis.xlen(f"{{{stream}}}:dlq") == 2, timeout=30, what="both entries dead-lettered")
    letters = {f["shoal:origin_id"]: f for _, f in redis.xrange(f"{{{stream}}}:dlq")}
    assert set(letters) == bad
    assert {f["shoal:deliveries"] for f in letters.values()} == {"2"}
    first, seventh = letters[ids[0]], letters[ids[7]]
    assert first["shoal:error"] == "ValueError: cannot parse report-\\udcff.csv"
    assert "report-\\udcff.csv" in first["shoal:traceback"]
    assert seventh["shoal:error"] == "RuntimeError: could not read the report"
    assert "OSError: no such file in-\\udcfe" in seventh["shoal:traceback"]
    wait_for(lambda: sorted(listed(redis, "handled", stream, "g")) == sorted(set(ids) - bad), timeout=30,
             what="the 18 others handled")
    wait_for(lambda: redis.xpending(stream, "g")["pending"] == 0, timeout=30, what="nothing pending")
    assert Counter(listed(redis, "started", stream, "g")) == {i: 2 if i in bad else 1 for i in ids}  # nothing rerun
    assert "UnicodeEncodeError" not in proc.output()
    assert "report-\\udcff.csv" in proc.output()  # the failure was logged, escaped
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()
    assert "crashed" not in proc.output()


def test_a_key_with_nul_is_handled_once_by_a_db_guarded_group_on_postgresql(redis, run_consumer, postgres_database):
    key = "order\x0042"
    first = publish("dbjobs", {"name": "nul-key"}, key=key)
    plain = publish("dbjobs", {"name": "plain"}, key="order-43")
    proc = run_consumer("dbjobs:d", streams={"RETRY_BACKOFF": 0.05}, env={"DATABASE_URL": postgres_database.url})
    wait_for(lambda: len(listed(redis, "started", "dbjobs", "d")) == 2 and redis.xpending("dbjobs", "d")["pending"] == 0,
             timeout=30, what="both handled and acked")
    again = publish("dbjobs", {"name": "nul-key"}, key=key)  # the same key again: a duplicate
    proc.wait_for_output("is a duplicate; acked without running the handler")
    wait_for(lambda: redis.xpending("dbjobs", "d")["pending"] == 0, timeout=30, what="the duplicate acked")
    assert sorted(listed(redis, "started", "dbjobs", "d")) == sorted([first, plain])
    assert sorted(postgres_database.rows("SELECT name, entry_id FROM testapp_effect")) == [("nul-key", first),
                                                                                        ("plain", plain)]
    hashed = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    assert sorted(postgres_database.rows("SELECT key FROM streams_app_processedmessage")) == [("order-43",), (hashed,)]
    assert redis.xlen("{dbjobs}:dlq") == 0 and again
    assert "DataError" not in proc.output()
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()


def test_a_pod_name_that_is_not_utf8_makes_an_escaped_consumer_name(redis, run_consumer):
    ids = publish_raw(redis, "jobs", [{"n": n} for n in range(3)])
    proc = run_consumer("jobs:a", env={"POD_NAME": os.fsdecode(b"pod \xff")})  # os.environ holds it as a surrogate
    wait_for(lambda: sorted(listed(redis, "handled", "jobs", "a")) == sorted(ids), timeout=30, what="the entries handled")
    [consumer] = redis.xinfo_consumers("jobs", "a")
    assert consumer["name"].startswith("pod-\\udcff-")  # no space either: CLIENT SETNAME refuses one
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.output()
