"""The payload codec (streams_app/publishing/codec.py): the envelope, both engines, refusals, exact size limit."""
import datetime
import decimal
import json
import math
import uuid

import pytest
from django.core.management import CommandError, call_command

from streams_app import publish, publish_many
from streams_app.publishing import codec
from streams_app.redis import keys
from streams_app.checks import check_streams_settings
from streams_app.exceptions import PayloadDecodeError, PublishError
from streams_app.publishing.message import Message

ENGINES = ["json", "orjson"]
UTC = datetime.UTC

VALUES = {
    "datetime": datetime.datetime(2026, 11, 30, 20, 29, 11, 364826, tzinfo=UTC),
    "naive datetime": datetime.datetime(2026, 11, 30, 20, 29, 11),
    "offset datetime": datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=5, minutes=30))),
    "date": datetime.date(2026, 2, 28),
    "time": datetime.time(23, 59, 59, 999999),
    "tz time": datetime.time(8, 15, tzinfo=UTC),
    "timedelta": datetime.timedelta(days=-1, seconds=5, microseconds=1),
    "decimal": decimal.Decimal("-12345678901234567890.000000000000000001"),
    "decimal exponent": decimal.Decimal("1E+3"),
    "uuid": uuid.UUID("0b6c2a1e-3f4d-4c8e-9a7b-1d2e3f405162"),
}


def delivered(redis, entry_id, stream="jobs"):
    """The payload as a handler gets it: the entry read back from Redis as bytes, decoded by Message."""
    [(_, fields)] = _bytes_client(redis).xrange(stream, entry_id, entry_id)
    return Message(entry_id, stream, "g", fields).payload


def _bytes_client(redis):
    """A client that returns bytes, as the consumer's does (the ``redis`` fixture decodes)."""
    import redis as redis_py

    kwargs = redis.connection_pool.connection_kwargs
    return redis_py.Redis(host=kwargs["host"], port=kwargs["port"], db=kwargs.get("db", 0))


@pytest.fixture(params=ENGINES)
def engine(request, settings):
    settings.STREAMS = {**settings.STREAMS, "CODEC": request.param}
    return request.param


@pytest.mark.parametrize("name", VALUES)
def test_each_type_arrives_as_itself_alone_at_the_root_and_nested(redis, engine, name):
    value = VALUES[name]
    for payload in (value, {"v": value}, {"list": [1, {"a/b~c": value}]}):
        got = delivered(redis, publish("jobs", payload))
        assert got == payload and type(_find(got)) is type(value), (name, got)
        if isinstance(value, (datetime.datetime, datetime.time)):
            assert _find(got).utcoffset() == value.utcoffset()


def _find(payload):
    if isinstance(payload, dict):
        return _find(next(iter(payload.values())))
    if isinstance(payload, list):
        return _find(payload[-1])
    return payload


def test_the_envelope_is_plain_json_with_the_types_beside_it(redis, engine):
    entry = publish("jobs", {"at": VALUES["datetime"], "total": decimal.Decimal("9.99"), "id": VALUES["uuid"],
                             "lines": [{"a/b": VALUES["date"]}], "n": 1})
    [(_, fields)] = redis.xrange("jobs")
    assert json.loads(fields["payload"]) == {"at": "2026-11-30T20:29:11.364826+00:00", "total": "9.99",
                                             "id": "0b6c2a1e-3f4d-4c8e-9a7b-1d2e3f405162",
                                             "lines": [{"a/b": "2026-02-28"}], "n": 1}
    assert json.loads(fields["payload_types"]) == {"/at": "datetime", "/total": "decimal", "/id": "uuid",
                                                   "/lines/0/a~1b": "date"}
    assert delivered(redis, entry)["lines"][0]["a/b"] == VALUES["date"]


def test_payloads_without_typed_values_have_no_types_field(redis, engine):
    # orjson writes UUIDs itself, so a UUID-shaped string makes it look: it must still find no type.
    publish("jobs", {"n": 1, "s": "0b6c2a1e-3f4d-4c8e-9a7b-1d2e3f405162", "none": None})
    [(_, fields)] = redis.xrange("jobs")
    assert set(fields) == {"payload", "published_at"}


@pytest.mark.parametrize("field", ["payload", "data"])
def test_entries_of_other_producers_decode_unchanged(redis, engine, field):
    # Including what looks like a date: without payload_types it stays the string it is.
    body = '{"at":"2026-11-30T20:29:11Z","n":12345678901234567,"f":0.1,"l":[true,null]}'
    entry = redis.xadd("jobs", {field: body})
    assert delivered(redis, entry) == json.loads(body)


def test_key_paths_name_the_offending_value_and_nothing_is_published(redis, engine):
    bad = {"items": [{"price": 1}, {"price": 2}, {"price": 3}, {"price": {1, 2}}]}
    message = 'payload["items"][3]["price"]: set is not JSON-serialisable'
    with pytest.raises(PublishError) as error:
        publish("jobs", bad)
    assert str(error.value) == message
    with pytest.raises(PublishError) as error:
        publish_many("jobs", [{"n": 0}, {"at": VALUES["datetime"]}, bad])
    assert str(error.value) == f"message 2: {message}"
    for payload, text in [({"a": {"b": object()}}, 'payload["a"]["b"]: object is not JSON-serialisable'),
                          ([VALUES["uuid"], {1j: 1}], "payload[1]: the key 1j (complex) is not JSON-serialisable"),
                          ({"d": [decimal.Decimal("NaN")]}, "payload[\"d\"][0]: Decimal('NaN') is not JSON-serialisable")]:
        with pytest.raises(PublishError) as error:
            publish("jobs", payload)
        assert str(error.value).startswith(text), str(error.value)
    assert redis.keys("*") == []


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused_by_both_engines_even_beside_null(redis, engine, value):
    # orjson would write NaN as null: a payload holding a real null must not hide one.
    for payload, path in [(value, "payload"), ({"a": None, "b": [1, value]}, 'payload["b"][1]'),
                          ({"at": VALUES["date"], "x": value}, 'payload["x"]')]:
        with pytest.raises(PublishError) as error:
            publish("jobs", payload)
        assert str(error.value) == f"{path}: {value!r} is not JSON-serialisable (JSON has no NaN or Infinity)"
    assert redis.keys("*") == []


def test_the_size_limit_is_exact_in_utf8_bytes_with_both_engines(redis, engine, settings):
    limit = 1000
    settings.STREAMS = {**settings.STREAMS, "MAX_PAYLOAD_BYTES": limit}
    at_limit = "é" * ((limit - 2) // 2)  # 2 bytes each, plus the two quotes
    publish("jobs", at_limit)
    with pytest.raises(PublishError, match=f"^payload is {limit + 1} bytes, over the limit of {limit} "):
        publish("jobs", at_limit + "x")
    # The types field counts towards the entry: payload + payload_types (+ key, headers) <= limit.
    typed = {"d": VALUES["date"], "s": ""}
    body, types = codec.encode(typed, engine)
    room = limit - len(body) - len(types.encode())
    publish("jobs", {**typed, "s": "x" * room})
    with pytest.raises(PublishError, match=f"^entry is {limit + 1} bytes \\(payload, its types, key and headers\\)"):
        publish("jobs", {**typed, "s": "x" * (room + 1)})
    assert redis.xlen("jobs") == 2


def test_orjson_falls_back_to_json_where_it_would_differ(redis):
    for payload in [{"big": 2**70}, {1: "int key", None: "none key"}, [True, 1.5e300]]:
        assert codec.encode(payload, "orjson") == codec.encode(payload, "json")
    with pytest.raises(PublishError, match="lone surrogate"):
        codec.encode({"s": "\ud800"}, "orjson")


def test_orjson_reads_what_json_reads_as_json_reads_it(redis, settings):
    settings.STREAMS = {**settings.STREAMS, "CODEC": "orjson"}
    for body in ['{"big":123456789012345678901234567890,"neg":-9223372036854775809}', '{"s":"\\ud800"}',
                 '[1.5,2e-7,"caf\u00e9"]']:
        entry = redis.xadd("jobs", {"payload": body})
        assert delivered(redis, entry) == json.loads(body), body
    entry = redis.xadd("jobs", {"payload": '{"n":NaN}'})  # not JSON, but json.loads takes it: so does Shoal, as before
    assert math.isnan(delivered(redis, entry)["n"])
    entry = redis.xadd("jobs", {"payload": "{bad"})
    with pytest.raises(PayloadDecodeError, match="payload is not valid JSON"):
        delivered(redis, entry)


def test_payload_types_that_do_not_fit_make_the_entry_poison(redis):
    for types, reason in [('{"/at":"date"}', "'nope' at '/at' is not a date"), ('{"/x":"date"}', "'/x' is not in the payload"),
                          ('{"/at":"money"}', "unknown type 'money'"), ('["/at"]', "must be a JSON object"),
                          ('{"/n":"uuid"}', "the value at '/n' is not text")]:
        entry = redis.xadd("jobs", {"payload": '{"at":"nope","n":1}', "payload_types": types})
        with pytest.raises(PayloadDecodeError, match=reason):
            delivered(redis, entry)


def test_an_unknown_codec_is_refused_by_publish_and_by_the_checks(redis, settings):
    with pytest.raises(PublishError, match="unknown codec 'yaml'"):
        publish("jobs", {"n": 1}, codec="yaml")
    settings.STREAMS = {**settings.STREAMS, "CODEC": "yaml"}
    assert [e.id for e in check_streams_settings()] == ["streams_app.E030"]
    assert redis.keys("*") == []


def test_cli_replay_with_an_edited_payload_keeps_the_types_it_is_given(redis):
    redis.xgroup_create("jobs", "a", id="0", mkstream=True)  # a replay needs its group to exist
    entry = redis.xadd(keys.dead_letter_key("jobs"), {
        "payload": '{"at":"2026-01-01"}', "payload_types": '{"/at":"date"}', "origin_stream": "jobs",
        "origin_id": "1-0", "group": "a", "error": "x", "deliveries": "1"})
    with pytest.raises(CommandError, match="'tomorrow' at '/at' is not a date"):
        call_command("replay", "jobs", "--group", "a", "--id", entry, "--payload", '{"at": "tomorrow"}',
                     "--payload-types", '{"/at": "date"}')
    with pytest.raises(CommandError, match="give --payload too"):
        call_command("replay", "jobs", "--group", "a", "--id", entry, "--payload-types", '{"/at": "date"}')
    call_command("replay", "jobs", "--group", "a", "--id", entry, "--payload", '{"at": "2027-03-04", "n": 1}',
                 "--payload-types", '{"/at": "date"}')
    [(new, _)] = redis.xrange("jobs")
    assert delivered(redis, new) == {"at": datetime.date(2027, 3, 4), "n": 1}


def test_python_replay_override_keeps_types_and_a_plain_override_drops_the_old_ones(redis):
    redis.xgroup_create("jobs", "a", id="0", mkstream=True)  # a replay needs its group to exist
    from streams_app.deadletters.replay import replay

    def letter():
        return redis.xadd(keys.dead_letter_key("jobs"), {
            "payload": '{"at":"2026-01-01"}', "payload_types": '{"/at":"date"}', "origin_stream": "jobs",
            "origin_id": "1-0", "group": "a", "error": "x", "deliveries": "1"})

    replay("jobs", "a", ids=[letter()], payload_override={"total": decimal.Decimal("1.10")})
    replay("jobs", "a", ids=[letter()], payload_override={"at": "not a date any more"})
    first, second = (i for i, _ in redis.xrange("jobs"))
    assert delivered(redis, first) == {"total": decimal.Decimal("1.10")}
    assert delivered(redis, second) == {"at": "not a date any more"}


def test_without_the_orjson_package_the_default_codec_is_a_configuration_error(settings, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "orjson", None)  # "import orjson" raises ImportError, as when not installed
    codec.engine.cache_clear()
    [error] = check_streams_settings()
    assert error.id == "streams_app.E030" and "cannot be imported" in error.msg and "'json'" in error.hint
    settings.STREAMS = {**settings.STREAMS, "CODEC": "json"}
    assert check_streams_settings() == []
    codec.engine.cache_clear()
