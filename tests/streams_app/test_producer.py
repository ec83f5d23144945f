import io
import json

import pytest
from django.core.management import CommandError, call_command

from streams_app import publish, publish_many
from streams_app.exceptions import PublishError

pytestmark = pytest.mark.both_redis


def test_publish_stores_json_payload_and_metadata(redis):
    entry_id = publish("orders", {"order_id": 7, "note": "café"}, key="order-7", headers={"trace": "t1"})
    [(got_id, fields)] = redis.xrange("orders")
    assert got_id == entry_id
    assert json.loads(fields["payload"]) == {"order_id": 7, "note": "café"}
    assert fields["key"] == "order-7"
    assert json.loads(fields["headers"]) == {"trace": "t1"}
    assert int(fields["published_at"]) > 0


def test_publish_many_keeps_order_and_returns_every_id(redis):
    ids = publish_many("orders", [{"n": n} for n in range(2500)], keys=[f"k{n}" for n in range(2500)])
    assert len(ids) == 2500
    entries = redis.xrange("orders")
    assert [e[0] for e in entries] == ids
    assert [json.loads(f["payload"])["n"] for _, f in entries] == list(range(2500))


def test_publish_on_a_pipeline_is_sent_with_it(redis):
    from streams_app.redis.connection import get_connection

    pipe = get_connection().pipeline()
    assert publish("orders", {"a": 1}, pipeline=pipe) is None
    assert redis.xlen("orders") == 0
    pipe.execute()
    assert redis.xlen("orders") == 1


def test_maxlen_trims_approximately(redis):
    for n in range(3000):
        publish("capped", {"n": n}, maxlen=100)
    # MAXLEN ~ trims whole nodes (100 entries each by default): never below the cap, never far above.
    assert 100 <= redis.xlen("capped") <= 300


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: publish("orders", {"x": object()}), "not JSON-serialisable"),
        (lambda: publish("orders", float("nan")), "not JSON-serialisable"),
        (lambda: publish("", {}), "non-empty string"),
        (lambda: publish(42, {}), "non-empty string"),
        (lambda: publish("{orders}", {}), "must not contain"),
        (lambda: publish("orders", {}, maxlen=0), "maxlen"),
        (lambda: publish("orders", {}, key=""), "key"),
        (lambda: publish("orders", {}, headers=["x"]), "headers must be a dict"),
        (lambda: publish_many("orders", [{"ok": 1}, {"bad": {1, 2}}]), "message 1"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_published(redis, call, message):
    with pytest.raises(PublishError, match=message):
        call()
    assert not redis.exists("orders")


def test_payload_size_limit(redis, settings):
    settings.STREAMS = {"MAX_PAYLOAD_BYTES": 100}
    publish("orders", "x" * 90)
    with pytest.raises(PublishError, match="over the limit of 100"):
        publish("orders", "x" * 200)
    assert redis.xlen("orders") == 1


def test_publish_command_one_message(redis):
    out = io.StringIO()
    call_command("publish", "orders", '{"a": 1}', "--key", "k1", stdout=out)
    [(entry_id, fields)] = redis.xrange("orders")
    assert out.getvalue().strip() == entry_id
    assert fields["key"] == "k1"


def test_publish_command_reads_stdin_lines(redis, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO('{"a": 1}\n\n[1, 2]\n"text"\n'))
    out = io.StringIO()
    call_command("publish", "orders", "-", stdout=out)
    assert len(out.getvalue().split()) == 3
    assert [json.loads(f["payload"]) for _, f in redis.xrange("orders")] == [{"a": 1}, [1, 2], "text"]


def test_publish_command_names_the_bad_line_and_publishes_nothing(redis, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO('{"a": 1}\n{"b": \n'))
    with pytest.raises(CommandError, match="line 2 of stdin is not valid JSON"):
        call_command("publish", "orders", "-")
    assert not redis.exists("orders")


def test_publish_command_refuses_key_with_many_messages(redis, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO('{"a": 1}\n'))
    with pytest.raises(CommandError, match="--key"):
        call_command("publish", "orders", "-", "--key", "k")
    assert not redis.exists("orders")


def test_publish_waiting_for_replicas_says_when_none_confirmed(redis):
    from streams_app.exceptions import NotReplicatedError

    with pytest.raises(NotReplicatedError, match="0 of 1 replica") as raised:
        publish("jobs", {"n": 1}, replicas=1, replicas_timeout_ms=50)  # this Redis has no replica
    assert redis.xrange("jobs")[0][0] == raised.value.id  # stored on the master all the same
    with pytest.raises(PublishError, match="replicas must be a positive integer"):
        publish("jobs", {"n": 1}, replicas=0)


@pytest.mark.parametrize("partitioned", [False, True])
def test_publish_many_waiting_for_replicas_stores_everything_and_names_the_unconfirmed(partitioned, redis, settings):
    from streams_app.partitioning import partitions
    from streams_app.exceptions import NotReplicatedError

    if partitioned:
        settings.STREAMS = {**settings.STREAMS, "PARTITIONS": {"jobs": 3}}
    with pytest.raises(NotReplicatedError, match="2500 messages of 'jobs' are stored") as raised:
        publish_many("jobs", [{"n": n} for n in range(2500)], keys=[f"k{n}" for n in range(2500)],
                     replicas=1, replicas_timeout_ms=50)  # this Redis has no replica
    error = raised.value
    assert (error.replicas, error.unconfirmed, error.id) == (0, list(range(2500)), None)
    # Partitions are streams of their own: an id is only unique within its partition.
    stored = {(name, entry_id): json.loads(fields["payload"])["n"]
              for name in partitions.names("jobs") for entry_id, fields in redis.xrange(name)}
    assert [stored[partitions.route("jobs", f"k{n}"), entry_id] for n, entry_id in enumerate(error.ids)] == list(range(2500))
    with pytest.raises(PublishError, match="replicas must be a positive integer"):
        publish_many("jobs", [{"n": 1}], replicas=0)
    with pytest.raises(PublishError, match="outbox"):
        publish_many("jobs", [{"n": 1}], replicas=1, outbox=True)


@pytest.mark.parametrize("timeout", [0, -5, True, 1.5, "1000"])
def test_a_bad_replicas_timeout_is_refused_before_anything_is_stored(redis, timeout):
    # WAIT 0 blocks until the replicas confirm: with none, until the socket timeout, after the XADD.
    for call in (lambda: publish("jobs", {"n": 1}, replicas=1, replicas_timeout_ms=timeout),
                 lambda: publish_many("jobs", [{"n": 1}], replicas=1, replicas_timeout_ms=timeout)):
        with pytest.raises(PublishError, match="replicas_timeout_ms must be a positive integer of milliseconds"):
            call()
    assert not redis.exists("jobs")


def test_a_replicas_timeout_past_the_clients_socket_timeout_is_refused_before_anything_is_stored(redis):
    # project/settings.py (shoal_common.cache): SOCKET_TIMEOUT 5 s, so WAIT may last at most 4 000 ms.
    for call in (lambda: publish("jobs", {"n": 1}, replicas=1, replicas_timeout_ms=4_001),
                 lambda: publish_many("jobs", [{"n": 1}], replicas=1, replicas_timeout_ms=60_000)):
        with pytest.raises(PublishError, match=r"must be at most 4000 ms: one second below .* socket timeout \(5 s"):
            call()
    assert not redis.exists("jobs")


@pytest.mark.parametrize("payloads, kind", [({"a": 1}, "dict"), ("abc", "str"), (b"abc", "bytes")])
def test_publish_many_refuses_one_payload_where_a_list_of_them_belongs(redis, payloads, kind):
    # A dict would publish its keys, a str its characters: publish() was meant, or a list of one.
    with pytest.raises(PublishError, match=rf"publish_many\(\) takes an iterable of payloads, one per message, "
                                           rf"not a {kind}; use publish\(stream, payload\)"):
        publish_many("orders", payloads)
    with pytest.raises(PublishError, match="keys takes an iterable of keys, one per message, not a str"):
        publish_many("orders", [1, 2, 3], keys="abc")
    assert redis.exists("orders") == 0
