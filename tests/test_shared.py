"""shoal_common's small helpers: one back-off formula, text decoding, entry ids, Redis error predicates."""
import pytest
import redis as redis_module

from shoal_common.backoff import backoff_delay
from shoal_common.redis_errors import is_busygroup, is_missing, is_nogroup, is_no_such_key, is_wrongtype
from shoal_common.text import to_text
from streams_app.redis.entry_ids import id_key, is_entry_id, next_id


def test_backoff_doubles_from_first_up_to_the_cap():
    assert [backoff_delay(n, first=0.1, cap=1.0) for n in range(6)] == [0.0, 0.1, 0.2, 0.4, 0.8, 1.0]
    assert backoff_delay(10_000, first=0.1, cap=5.0) == 5.0  # no overflow after a long outage


def test_backoff_jitter_only_shortens():
    assert backoff_delay(3, first=1.0, cap=60, jitter=0.5, rng=lambda: 0.0) == 4.0
    assert backoff_delay(3, first=1.0, cap=60, jitter=0.5, rng=lambda: 1.0) == 2.0


def test_to_text():
    assert to_text(b"caf\xc3\xa9") == "café" and to_text("x") == "x" and to_text(None) is None
    assert to_text(b"\xff", errors="replace") == "\ufffd"
    with pytest.raises(UnicodeDecodeError):
        to_text(b"\xff")


def test_entry_ids():
    assert is_entry_id("1700000000000-0") and not is_entry_id("1700000000000") and not is_entry_id("1-0\n")
    assert not is_entry_id(b"1-0") and not is_entry_id("-1-0")
    # Each part is a 64-bit unsigned integer in Redis: one past it is no id (a 404, not a Redis error).
    assert is_entry_id(f"{2**64 - 1}-{2**64 - 1}") and not is_entry_id(f"{2**64}-0") and not is_entry_id(f"0-{2**64}")
    assert sorted(["10-0", "9-1", "9-0"], key=id_key) == ["9-0", "9-1", "10-0"]
    assert next_id(b"5-9") == "5-10"


def test_redis_error_predicates_read_real_replies(redis):
    redis.set("plain", "x")
    redis.xadd("s", {"a": "1"})
    redis.xgroup_create("s", "g")
    replies = {}
    for name, call in [("busy", lambda: redis.xgroup_create("s", "g")), ("wrongtype", lambda: redis.xadd("plain", {"a": 1})),
                       ("nogroup", lambda: redis.xreadgroup("nope", "c", {"s": ">"})),
                       ("nokey", lambda: redis.xinfo_groups("absent"))]:
        with pytest.raises(redis_module.ResponseError) as caught:
            call()
        replies[name] = caught.value
    pipe = redis.pipeline(transaction=False)
    pipe.xreadgroup("nope", "c", {"s": ">"})
    with pytest.raises(redis_module.ResponseError) as caught:
        pipe.execute()
    assert is_busygroup(replies["busy"]) and not is_busygroup(replies["nogroup"])
    assert is_wrongtype(replies["wrongtype"])
    assert is_nogroup(replies["nogroup"]) and is_nogroup(caught.value)  # a pipeline prefixes the message
    assert is_no_such_key(replies["nokey"]) and is_missing(replies["nokey"]) and is_missing(replies["nogroup"])
    assert not is_missing(replies["wrongtype"])



