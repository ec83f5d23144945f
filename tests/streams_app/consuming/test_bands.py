"""Priority bands (``@consumer(..., bands=...)``): one stream per band, a lower band reading only while
the higher ones have nothing unread (streams_app/consuming/bands.py)."""
import pytest

from streams_app import consumer
from streams_app.consuming.bands import waiting
from streams_app.exceptions import ConsumerConfigError
from streams_app.registry import _registry, registered, select

pytestmark = pytest.mark.both_redis


@pytest.fixture
def clean_registry():
    saved = dict(_registry)
    yield
    _registry.clear()
    _registry.update(saved)


def handler(message):
    pass


def test_a_banded_consumer_is_one_spec_per_band_each_yielding_to_those_above(clean_registry):
    consumer("banded", group="w", bands=("high", "", "low"))(handler)
    specs = [(spec.stream, spec.yields_to) for spec in registered() if spec.stream.startswith("banded")]
    assert specs == [("banded:high", ()), ("banded", ("banded:high",)), ("banded:low", ("banded:high", "banded"))]
    assert [spec.stream for spec in select(["banded:w"])] == ["banded:high", "banded", "banded:low"]


@pytest.mark.parametrize("bands", ["high", ("high",), ("high", "low"), ("high", "", "high"), ("a:b", "")])
def test_bad_bands_are_refused_at_declaration(clean_registry, bands):
    with pytest.raises(ConsumerConfigError, match="bands must"):
        consumer("banded", group="w", bands=bands)(handler)


def test_bands_cannot_be_ordered(clean_registry):
    with pytest.raises(ConsumerConfigError, match="ordered"):
        consumer("banded", group="w", bands=("high", ""), ordered=True)(handler)


def test_a_band_waits_while_a_higher_one_holds_entries_the_group_has_not_read(redis):
    assert not waiting(redis, ["banded:high"], "w")  # no stream yet
    redis.xgroup_create("banded:high", "w", id="0", mkstream=True)
    assert not waiting(redis, ["banded:high"], "w")
    redis.xadd("banded:high", {"payload": "1"})
    assert waiting(redis, ["banded:high"], "w")
    assert not waiting(redis, ["banded:high"], "other")  # another group's lag is not this one's
    redis.xreadgroup("w", "c", {"banded:high": ">"})
    assert not waiting(redis, ["banded:high"], "w")  # delivered (pending or acked): nothing waits unread


def test_a_band_whose_lag_redis_cannot_tell_compares_the_ids(redis):
    redis.xgroup_create("banded:high", "w", id="0", mkstream=True)
    first = redis.xadd("banded:high", {"payload": "1"})
    redis.xadd("banded:high", {"payload": "2"})
    redis.xdel("banded:high", first)  # a deletion makes XINFO GROUPS report lag as nil
    assert waiting(redis, ["banded:high"], "w")
    redis.xreadgroup("w", "c", {"banded:high": ">"})
    assert not waiting(redis, ["banded:high"], "w")


def test_another_clients_group_named_in_bytes_not_utf8_does_not_break_the_bands_check(redis_server):
    raw = redis_server.client(decode_responses=False)
    raw.xgroup_create("banded:high", b"grp\xff\xfe", id="$", mkstream=True)
    raw.xgroup_create("banded:high", b"w", id="$")
    assert not waiting(raw, ["banded:high"], "w")
    raw.xadd("banded:high", {b"payload": b"{}"})
    assert waiting(raw, ["banded:high"], "w")
