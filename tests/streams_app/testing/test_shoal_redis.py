"""The shoal_redis fixture: real-Redis mode on a private redis-server, empty for each test."""
from streams_app import publish


def test_publishes_reach_the_private_redis(shoal_redis):
    assert shoal_redis.url != "redis://127.0.0.1:1/0"  # not the settings' Redis
    entry_id = publish("orders", {"id": 1})
    with shoal_redis.client() as client:
        assert [entry_id] == [i for i, _ in client.xrange("orders")]


def test_each_test_starts_with_an_empty_redis(shoal_redis):
    with shoal_redis.client() as client:
        assert client.dbsize() == 0
