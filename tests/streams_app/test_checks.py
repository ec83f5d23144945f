from streams_app.checks import check_streams_settings


def ids(settings_value, settings):
    settings.STREAMS = settings_value
    return [e.id for e in check_streams_settings()]


def test_defaults_pass(settings):
    assert ids({}, settings) == []


def test_not_a_dict(settings):
    assert ids(["BATCH_SIZE"], settings) == ["streams_app.E001"]


def test_unknown_key(settings):
    assert ids({"BATCHSIZE": 10}, settings) == ["streams_app.E002"]


def test_bad_values(settings):
    assert ids({"BATCH_SIZE": 0, "SHUTDOWN_TIMEOUT": "30"}, settings) == ["streams_app.E003", "streams_app.E003"]


def test_unknown_alias(settings):
    assert ids({"REDIS_ALIAS": "nope"}, settings) == ["streams_app.E004"]


def test_a_block_longer_than_the_socket_timeout_is_fine(settings):
    # A consumer's reader has a socket timeout of its own, BLOCK_MS + 5 s (streams_app.redis.connection):
    # the shared pool's SOCKET_TIMEOUT (5 s by default) does not bound a blocking read.
    assert ids({"BLOCK_MS": 60_000, "PENDING_TIMEOUT_MS": 120_000}, settings) == []


def test_pending_timeout_below_block_warns(settings):
    assert ids({"PENDING_TIMEOUT_MS": 1000, "BLOCK_MS": 2000}, settings) == ["streams_app.W002"]


def test_broadcast_channel_must_be_a_name(settings):
    assert ids({"BROADCAST_CHANNEL": ""}, settings) == ["streams_app.E020"]
    assert ids({"BROADCAST_CHANNEL": "team-a:broadcast"}, settings) == []


def test_a_lease_interval_above_a_third_of_the_ttl_is_an_error_as_its_hint_says(settings):
    for interval in (1500, 1001):
        settings.STREAMS = {"LEASE_TTL_MS": 3000, "LEASE_INTERVAL_MS": interval}
        [error] = [e for e in check_streams_settings() if e.id == "streams_app.E032"]
        assert "above a third of LEASE_TTL_MS" in error.msg and "at least three times" in error.hint
    settings.STREAMS = {"LEASE_TTL_MS": 3000, "LEASE_INTERVAL_MS": 1000}
    assert "streams_app.E032" not in {e.id for e in check_streams_settings()}


def test_an_admin_timeout_as_long_as_the_socket_timeout_warns(settings):
    assert ids({"ADMIN_REDIS_TIMEOUT": 30}, settings) == ["streams_app.W003"]
    assert ids({"ADMIN_REDIS_TIMEOUT": 0}, settings) == ["streams_app.E003"]


def test_a_lease_ttl_below_a_second_is_warned_about(settings):
    settings.STREAMS = {"LEASE_TTL_MS": 30, "LEASE_INTERVAL_MS": 10}
    [warning] = [e for e in check_streams_settings() if e.id == "streams_app.W032"]
    assert "(30 ms) is below 1000 ms" in warning.msg and warning.level == 30
    settings.STREAMS = {"LEASE_TTL_MS": 1000, "LEASE_INTERVAL_MS": 300}
    assert [e.id for e in check_streams_settings()] == []


def test_a_redis_url_without_a_scheme_is_a_check_error_not_a_traceback_in_every_command(settings):
    # A user trial: REDIS_URL=127.0.0.1:6379 passed `check`, then every command printed redis-py's traceback.
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": "127.0.0.1:6379"}}
    [error] = [e for e in check_streams_settings() if e.id == "streams_app.E041"]
    assert "'127.0.0.1:6379' is not a Redis URL" in error.msg and "redis://HOST:PORT/DB" in error.hint
    settings.CACHES = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": "redis://h:1/0"}}
    assert "streams_app.E041" not in {e.id for e in check_streams_settings()}
