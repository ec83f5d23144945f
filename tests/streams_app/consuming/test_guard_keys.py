"""The stored form of idempotency keys (streams_app.consuming.idempotency.guard_key): the same for both
guards, unchanged for every key a deployment may already hold, distinct for distinct bytes."""
import hashlib

import pytest

from streams_app.consuming.idempotency import guard_key, message_key
from streams_app.publishing.message import Message


def before_the_bytes_rule(key):
    """How keys were stored until keys that are not UTF-8 were hashed (the text rule, on decoded text)."""
    if len(key) > 200 or "\x00" in key:
        return "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return key


@pytest.mark.parametrize("key", ["order-1", "a\ufffd", "é" * 200, "é" * 201, "x" * 200, "x" * 201, "a\x00b",
                                 "sha256:" + "0" * 64, "日本語", "\U0001f600"])
def test_a_valid_utf8_key_keeps_the_stored_form_deployments_hold(key):
    assert guard_key(key.encode()) == before_the_bytes_rule(key)


def test_bytes_that_are_not_utf8_are_hashed_one_key_per_byte_string():
    keys = [guard_key(raw) for raw in (b"a\xff", b"a\xfe", b"a\xef\xbf\xbd", b"\xff" * 300)]
    assert keys[0] == "sha256:" + hashlib.sha256(b"a\xff").hexdigest()
    assert len(set(keys)) == 4
    assert guard_key(b"a\xff") == keys[0]


def test_a_decoded_clients_fields_give_the_same_keys_as_a_bytes_clients():
    as_bytes = Message("1-0", "s", "g", {b"key": "k€".encode(), b"payload": b"{}"})
    as_text = Message("1-0", "s", "g", {"key": "k€", "payload": "{}"})
    assert message_key(as_bytes) == message_key(as_text) == "k€"


def test_the_outbox_id_comes_first_then_the_key_then_the_entry_id():
    assert message_key(Message("1-0", "s", "g", {b"key": b"k", b"shoal:idempotency_id": b"i\xff"})) == guard_key(b"i\xff")
    assert message_key(Message("1-0", "s", "g", {b"key": b"k", b"shoal:idempotency_id": b""})) == "k"
    assert message_key(Message("1-0", "s", "g", {b"payload": b"{}"})) == "1-0"
