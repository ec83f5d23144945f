"""Bad input an operator meets (issues 22 and 23): each case here was a 500, a traceback, a crash or
a false message before; now it is a clear error, or it works.

Process-level cases (the reclaimer, the db guard on SQLite and PostgreSQL) are in
tests/test_operator_processes.py.
"""
import functools
import io
import json
import os
import sys

import pytest
from django.core.checks import run_checks
from django.core.management import CommandError, call_command

from discovery_app.exceptions import InvalidRegistration
from discovery_app.registry import build_instance
from streams_app import publish, publish_many
from streams_app.broadcast import broadcast
from streams_app.exceptions import BroadcastError, ConsumerConfigError, PublishError, ReplayError
from streams_app.deadletters.replay import replay
from streams_app.registry import ConsumerSpec, consumer
from tests.streams_app.admin.fixtures import dead_letter, pending, staff_client  # noqa: F401


def snapshot(redis):
    return {key: redis.type(key) for key in redis.keys("*")}


# -- lone surrogates ----------------------------------------------------------------------------

LONE = "\ud800"


def test_a_lone_surrogate_is_a_publish_error_not_a_traceback(redis):
    for kwargs in [{"payload": {"s": LONE}}, {"payload": "ok", "key": "k" + LONE},
                   {"payload": "ok", "headers": {"h": LONE}}]:
        payload = kwargs.pop("payload")
        with pytest.raises(PublishError, match="not valid Unicode"):
            publish("jobs", payload, **kwargs)
    with pytest.raises(PublishError, match=r"message 1: payload .*not valid Unicode"):
        publish_many("jobs", [{"n": 0}, {"s": LONE}])
    with pytest.raises(CommandError, match="nothing was published: payload .*not valid Unicode"):
        call_command("publish", "jobs", '{"s": "\\ud800"}')
    assert snapshot(redis) == {}


@pytest.mark.django_db
def test_a_key_with_a_lone_surrogate_is_refused_on_every_publish_path(redis):
    """docs/limits.md: what Python makes of a key argument that is not UTF-8 (os.fsdecode) is refused."""
    from datetime import timedelta

    from streams_app.outbox.models import OutboxMessage

    key = "a\udcff"
    said = r"key is not valid Unicode: it holds a lone surrogate '\\udcff' at position 1, which UTF-8 cannot encode"
    for call in (lambda: publish("jobs", {}, key=key), lambda: publish("jobs", {}, key=key, outbox=True),
                 lambda: publish("jobs", {}, key=key, run_after=timedelta(seconds=5))):
        with pytest.raises(PublishError, match=f"^{said}$"):
            call()
    for outbox in (False, True):
        with pytest.raises(PublishError, match=f"^message 1: {said}$"):
            publish_many("jobs", [{}, {}], keys=["ok", key], outbox=outbox)
    with pytest.raises(CommandError, match=f"^nothing was published: {said}$"):
        call_command("publish", "jobs", "{}", "--key", os.fsdecode(b"a\xff"))
    assert snapshot(redis) == {} and not OutboxMessage.objects.exists()


def test_a_lone_surrogate_in_a_replay_override_is_a_command_error(redis):
    [letter] = dead_letter(redis, [{"n": 1}])
    with pytest.raises(ReplayError, match="not valid Unicode"):
        replay("jobs", "a", ids=[letter], payload_override={"s": LONE})
    with pytest.raises(CommandError, match="not valid Unicode"):
        call_command("replay", "jobs", "--group", "a", "--id", letter, "--payload", '{"s": "\\ud800"}')
    assert redis.xlen("{jobs}:dlq") == 1


def test_a_lone_surrogate_in_the_admins_edited_replay_is_a_form_error(staff_client, redis):
    from streams_app.admin import mirror
    from streams_app.models import DeadLetter

    [letter] = dead_letter(redis, [{"n": 1}])
    mirror.sync_all()
    pk = DeadLetter.objects.get(entry_id=letter).pk
    client = staff_client("streams_app.replay_deadletter")
    for post in ({"payload": '{"s": "\\ud800"}'}, {"payload": '{"s": "\\ud800"}', "post": "yes"}):
        response = client.post(f"/admin/streams_app/deadletter/{pk}/replay/", post)
        assert response.status_code == 400
        assert "not valid Unicode" in response.content.decode()
    assert redis.xlen("{jobs}:dlq") == 1


def test_nan_and_infinity_in_headers_and_a_lone_surrogate_stream_name_are_publish_errors(redis):
    for headers in ({"h": float("nan")}, {"h": [float("inf")]}, {"h": float("-inf")}):
        with pytest.raises(PublishError, match="headers are not JSON-serialisable: it holds NaN or Infinity"):
            publish("jobs", {"n": 1}, headers=headers)
        with pytest.raises(PublishError, match="message 0: headers are not JSON-serialisable"):
            publish_many("jobs", [{"n": 1}], headers=headers)
    for text in ('{"h": NaN}', '{"h": Infinity}', '{"h": 1e999}'):
        with pytest.raises(CommandError, match="nothing was published: headers .*NaN or Infinity"):
            call_command("publish", "jobs", '{"a": 1}', "--headers", text)
    for call in (lambda: publish(LONE, {}), lambda: publish_many("a" + LONE, [{}]), lambda: replay(LONE, "a", all=True)):
        with pytest.raises((PublishError, ReplayError), match="stream name is not valid Unicode"):
            call()
    with pytest.raises(CommandError, match="stream name is not valid Unicode"):
        call_command("publish", LONE, '{"a": 1}')
    assert snapshot(redis) == {}


# -- a replay override obeys publish's rules (findings 5 and 10) ------------------------------------

def test_a_replay_override_obeys_max_payload_bytes_and_refuses_nan(redis, settings):
    settings.STREAMS = {**settings.STREAMS, "MAX_PAYLOAD_BYTES": 1000}
    [letter] = dead_letter(redis, [{"n": 1}])
    before = redis.xlen("jobs")
    for override, why in [({"s": "x" * 2000}, r"over the limit of 1000"), ({"x": float("nan")}, "NaN or Infinity"),
                          (float("inf"), "NaN or Infinity")]:
        with pytest.raises(ReplayError, match=why):
            replay("jobs", "a", ids=[letter], payload_override=override)
    for text, why in [(json.dumps({"s": "x" * 2000}), "over the limit of 1000"), ('{"x": NaN}', "NaN or Infinity"),
                      ("1e999", "NaN or Infinity")]:
        with pytest.raises(CommandError, match=why):
            call_command("replay", "jobs", "--group", "a", "--id", letter, "--payload", text)
    assert redis.xlen("{jobs}:dlq") == 1 and redis.xlen("jobs") == before
    replay("jobs", "a", ids=[letter], payload_override={"s": "x" * 900})  # under the limit: replayed
    assert redis.xlen("jobs") == before + 1


def test_the_admins_edited_replay_form_refuses_what_publish_refuses_before_the_confirmation(staff_client, redis, settings):
    from streams_app.admin import mirror
    from streams_app.models import DeadLetter

    settings.STREAMS = {**settings.STREAMS, "MAX_PAYLOAD_BYTES": 1000}
    [letter] = dead_letter(redis, [{"n": 1}])
    mirror.sync_all()
    pk = DeadLetter.objects.get(entry_id=letter).pk
    before = redis.xlen("jobs")
    client = staff_client("streams_app.replay_deadletter")
    for text, why in [('{"x": NaN}', "NaN"), ("1e999", "Infinity"), (json.dumps({"s": "x" * 2000}), "over the limit of 1000")]:
        for post in ({"payload": text}, {"payload": text, "post": "yes"}):  # the form, and a forged confirmation
            response = client.post(f"/admin/streams_app/deadletter/{pk}/replay/", post)
            body = response.content.decode()
            assert response.status_code == 400, body[:2000]
            assert "This cannot be replayed" in body and why in body
    assert redis.xlen("{jobs}:dlq") == 1 and redis.xlen("jobs") == before


# -- the whole entry is bounded ---------------------------------------------------------------------

def test_max_payload_bytes_bounds_key_and_headers_too(redis, settings):
    settings.STREAMS = {**settings.STREAMS, "MAX_PAYLOAD_BYTES": 1000}
    publish("jobs", "x" * 900)
    with pytest.raises(PublishError, match=r"entry is \d+ bytes .*over the limit of 1000"):
        publish("jobs", "x" * 10, headers={"h": "y" * 2000})
    with pytest.raises(PublishError, match=r"entry is \d+ bytes .*over the limit of 1000"):
        publish("jobs", "x" * 10, key="k" * 2000)
    with pytest.raises(PublishError, match=r"entry is \d+ bytes"):
        publish("jobs", "x" * 600, key="k" * 600)
    assert redis.xlen("jobs") == 1


# -- settings checks ---------------------------------------------------------------------------

def test_nan_and_infinity_in_float_settings_fail_the_check(settings):
    settings.STREAMS = {"RECLAIM_INTERVAL": float("nan"), "CONSUMER_TTL": float("inf"), "BLOCK_MS": 100}
    errors = {(e.id, e.msg) for e in run_checks(databases=[])}
    assert ("streams_app.E003", "STREAMS['RECLAIM_INTERVAL'] must be a positive number, not nan.") in errors
    assert ("streams_app.E003", "STREAMS['CONSUMER_TTL'] must be a positive number, not inf.") in errors
    settings.STREAMS = {}
    settings.DISCOVERY = {"TTL": float("nan")}
    assert any(e.id.startswith("discovery_app.E") and "TTL" in e.msg for e in run_checks(databases=[]))


def test_huge_finite_settings_fail_the_check(settings):
    """Finite but beyond what Python's clocks, datetime or Redis take: E003 now, not a crash later."""
    settings.STREAMS = {"SNAPSHOT_RETENTION": 9999999999999999999999, "SNAPSHOT_INTERVAL": 1e300,
                        "PENDING_TIMEOUT_MS": 10**20, "BATCH_SIZE": 2**60, "IDEMPOTENCY_TTL": 10**10}
    errors = {e.msg.split("]")[0] + "]": e for e in run_checks(databases=[]) if e.id == "streams_app.E003"}
    assert sorted(errors) == ["STREAMS['BATCH_SIZE']", "STREAMS['IDEMPOTENCY_TTL']", "STREAMS['PENDING_TIMEOUT_MS']",
                              "STREAMS['SNAPSHOT_INTERVAL']", "STREAMS['SNAPSHOT_RETENTION']"]
    assert "must be at most 1,000,000,000 (about 31 years" in errors["STREAMS['SNAPSHOT_RETENTION']"].msg
    assert "must be at most 1,000,000,000,000" in errors["STREAMS['PENDING_TIMEOUT_MS']"].msg
    settings.STREAMS = {"SNAPSHOT_RETENTION": 10**9, "PENDING_TIMEOUT_MS": 10**12, "SNAPSHOT_INTERVAL": 1e9}
    assert not [e for e in run_checks(databases=[]) if e.id == "streams_app.E003"]
    settings.STREAMS = {}
    settings.DISCOVERY = {"TTL": 1e300}
    assert any(e.id == "discovery_app.E003" and "TTL" in e.msg for e in run_checks(databases=[]))


def test_runreclaimer_with_a_huge_snapshot_retention_exits_3(run_consumer):
    daemon = run_consumer("--once", command="runreclaimer", streams={"SNAPSHOT_RETENTION": 9999999999999999999999})
    assert daemon.wait(120) == 3, daemon.output()
    assert "SNAPSHOT_RETENTION" in daemon.output() and "Traceback" not in daemon.output()


def test_runconsumer_with_nan_settings_exits_3(redis, settings):
    settings.STREAMS = {"CONSUMER_TTL": float("nan")}
    with pytest.raises(CommandError) as raised:
        call_command("runconsumer", "jobs:a")
    assert raised.value.returncode == 3 and "CONSUMER_TTL" in str(raised.value)


# -- register --address --------------------------------------------------------------------------

@pytest.mark.parametrize("address, url", [
    ("[::1]", "http://[::1]:8000"), ("::1", "http://[::1]:8000"), ("10.0.0.7", "http://10.0.0.7:8000"),
    ("order-service.internal", "http://order-service.internal:8000"), ("localhost", "http://localhost:8000"),
    ("2001:db8::7", "http://[2001:db8::7]:8000"),
])
def test_register_takes_host_names_and_ip_literals_bracketing_ipv6_once(address, url):
    assert build_instance("svc", address, 8000).url == url


@pytest.mark.parametrize("address", ["10.0.0.7:9000", "http://10.0.0.7", "bad host", "[::1", "[10.0.0.7]",
                                     "a..b", "-a.com", "x" * 300, "10.0.0.7/24", "",
                                     # finding 13: a zone cannot be in the URL as given; numbers that are no IPv4
                                     "fe80::1%eth0", "[fe80::1%eth0]", "10.0.0.256", "1.2.3", "0x7f.1", "999999999",
                                     "host.0x1f"])
def test_register_refuses_what_is_not_a_host_name_or_ip(redis, address):
    with pytest.raises(InvalidRegistration, match="address"):
        build_instance("svc", address, 8000)
    with pytest.raises(CommandError, match="address"):
        call_command("register", "svc", "--address", address, "--port", "8000")
    assert snapshot(redis) == {}


# -- handler shapes ---------------------------------------------------------------------------

class Callable:
    def __call__(self, message):
        pass


def plain(message, extra=None):
    pass


def test_any_callable_has_a_handler_path():
    assert ConsumerSpec("s", "g", Callable()).handler_path == f"{__name__}.Callable instance"
    assert ConsumerSpec("s", "g", functools.partial(plain, extra=1)).handler_path == \
        f"functools.partial({__name__}.plain, extra=1)"
    assert ConsumerSpec("s", "g", print).handler_path == "builtins.print"


def test_a_group_name_with_a_colon_is_refused_at_declaration():
    with pytest.raises(ConsumerConfigError, match="group name 'email:v2' must not contain ':'"):
        consumer("orders", group="email:v2")


# -- replay --payload null ------------------------------------------------------------------------

def test_replay_payload_null_republishes_null(redis):
    first, second = dead_letter(redis, [{"n": 1}, {"n": 2}])
    call_command("replay", "jobs", "--group", "a", "--id", first, "--payload", "null", stdout=io.StringIO())
    result = replay("jobs", "a", ids=[second], payload_override=None)  # the library: None is "no override"
    payloads = [f["payload"] for _, f in redis.xrange("jobs") if f.get("shoal:replay_of")]
    assert payloads == ["null", json.dumps({"n": 2}, separators=(",", ":"))]
    assert result.replayed


def test_admin_replay_with_an_edited_payload_of_null_republishes_null(staff_client, redis):
    from streams_app.admin import mirror
    from streams_app.models import DeadLetter

    [letter] = dead_letter(redis, [{"n": 1}])
    mirror.sync_all()
    pk = DeadLetter.objects.get(entry_id=letter).pk
    client = staff_client("streams_app.replay_deadletter")
    response = client.post(f"/admin/streams_app/deadletter/{pk}/replay/", {"payload": "null", "post": "yes"})
    assert response.status_code == 302
    [replayed] = [f for _, f in redis.xrange("jobs") if f.get("shoal:replay_of")]
    assert replayed["payload"] == "null"


# -- broadcast ---------------------------------------------------------------------------------

@pytest.mark.parametrize("type, data, error", [
    ("log_level", {"level": "LOUD"}, "'LOUD' is not a logging level"),
    ("log_level", None, "needs data"),
    ("log_level", {"level": "DEBUG", "logger": 3}, "logger must be"),
    ("log_level", ["DEBUG"], "must be a JSON object"),
    ("discovery.invalidate", {"service": ""}, "service must be"),
    ("discovery.invalidate", "orders", "must be a JSON object"),
    ("ping", {"reply_to": 5}, "reply_to must be"),
    ("log_level", {"level": "NOTSET"}, "'NOTSET' is not a logging level"),  # finding 15: not a level to set
])
def test_broadcast_validates_data_of_built_in_types_before_sending(redis, type, data, error):
    pubsub = redis.pubsub()
    pubsub.subscribe("shoal:broadcast")
    with pytest.raises(BroadcastError, match=error):
        broadcast(type, data)
    with pytest.raises(CommandError, match="nothing was sent: .*" + error):
        call_command("broadcast", type, json.dumps(data), stdout=io.StringIO(), stderr=io.StringIO())
    assert broadcast("log_level", {"level": "info"}) == 1  # valid data still goes out
    pubsub.close()


def test_broadcast_data_with_a_lone_surrogate_is_refused_not_sent(redis):
    pubsub = redis.pubsub()
    pubsub.subscribe("shoal:broadcast")
    wait_for_subscription = pubsub.get_message(timeout=5)
    assert wait_for_subscription["type"] == "subscribe"
    for type, data in [("ping", {"reply_to": "r" + LONE}), ("discovery.invalidate", {"service": LONE}),
                       ("custom", {"x": LONE})]:
        with pytest.raises(BroadcastError, match="not valid Unicode: it holds a lone surrogate"):
            broadcast(type, data)
    assert pubsub.get_message(timeout=0.5) is None  # nothing was sent
    pubsub.close()


# -- dead letters sort by (ms, seq) -------------------------------------------------------------

def test_dead_letters_sorted_by_entry_id_follow_ms_then_seq(staff_client, redis):
    from streams_app.admin import mirror

    for seq in (1, 2, 10):
        redis.xadd("{jobs}:dlq", {"payload": "{}", "shoal:group": "a", "shoal:origin_id": f"1-{seq}", "shoal:error": "x"}, id=f"299-{seq}")
    redis.xadd("{jobs}:dlq", {"payload": "{}", "shoal:group": "a", "shoal:origin_id": "1-0", "shoal:error": "x"}, id="1000-0")
    mirror.sync_all()
    client = staff_client()
    page = client.get("/admin/streams_app/deadletter/", {"o": "0"}).content.decode()  # column 0: entry id (no actions for view-only staff)
    positions = [page.index(f">{i}<") for i in ("299-1", "299-2", "299-10", "1000-0")]
    assert positions == sorted(positions)


# -- publish STREAM - interrupted ----------------------------------------------------------------

@pytest.fixture
def redis_memory_cap(redis):
    """Cap the test Redis's memory (noeviction) a little above what it uses now: writes fail with OOM."""

    def cap(extra_bytes):
        redis.config_set("maxmemory-policy", "noeviction")
        redis.config_set("maxmemory", redis.info("memory")["used_memory"] + extra_bytes)

    yield cap
    redis.config_set("maxmemory", 0)


def test_publish_from_stdin_interrupted_by_redis_reports_exactly_what_was_published(redis, monkeypatch,
                                                                                      redis_memory_cap):
    lines = [json.dumps({"n": n, "pad": "x" * 200}) for n in range(20_000)]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    redis_memory_cap(1_500_000)
    out = io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("publish", "jobs", "-", stdout=out)
    message = str(raised.value)
    stored = redis.xrange("jobs")
    published = len(stored)
    assert 0 < published < 20_000 and published % 1000 == 0  # whole batches only: each one is atomic
    assert "nothing was published" not in message
    assert f"published {published} of 20000 messages (lines 1-{published}), last id {stored[-1][0]}" in message
    assert "OOM" in message or "memory" in message
    assert f"tail -n +{published + 1}" in message  # how to resume without duplicates
    assert out.getvalue().split() == [i for i, _ in stored]  # the ids printed are those stored
    assert [json.loads(f["payload"])["n"] for _, f in stored] == list(range(published))


def test_publish_from_stdin_names_the_real_line_of_a_bad_message_among_blank_lines(redis, monkeypatch):
    too_big = json.dumps("x" * 2_000_000)
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"n": 1}\n\n \n' + too_big + '\n{"n": 5}\n'))
    with pytest.raises(CommandError, match=r"nothing was published: line 4: payload is \d+ bytes"):
        call_command("publish", "jobs", "-")
    assert snapshot(redis) == {}


def test_publish_from_stdin_names_bytes_that_are_not_utf8(redis, redis_server):
    """Piped as the README shows: the command names the encoding, not "not valid JSON"."""
    import os
    import subprocess

    from tests.conftest import ROOT

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url}
    for locale in ("C", "C.UTF-8"):
        proc = subprocess.run([sys.executable, str(ROOT / "manage.py"), "publish", "jobs", "-"], cwd=ROOT,
                              env={**env, "LC_ALL": locale}, input=b'{"n": 1}\n\xff\xfe\n', capture_output=True,
                              timeout=120)
        err = proc.stderr.decode()
        assert proc.returncode == 1, err
        assert "line 2 of stdin is not valid UTF-8 (bytes ff" in err and "Traceback" not in err, err
    assert snapshot(redis) == {}


# -- admin bulk replay interrupted ----------------------------------------------------------------

@pytest.mark.django_db
def test_admin_replay_of_all_interrupted_by_redis_reports_what_was_replayed(staff_client, redis_factory, use_redis,
                                                                           monkeypatch):
    from django.contrib.admin.models import LogEntry

    from streams_app.admin import mirror, model_admins
    from streams_app.models import DeadLetter

    server = redis_factory()
    use_redis(server)
    conn = server.client()
    dead_letter(conn, [{"n": n} for n in range(450)])
    mirror.sync_all()
    real, calls = model_admins.replay, []

    def replay_then_lose_redis(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            server.stop()  # Redis goes away after two batches (ACTION_BATCH = 200) were replayed
        return real(*args, **kwargs)

    monkeypatch.setattr(model_admins, "replay", replay_then_lose_redis)
    client = staff_client("streams_app.replay_deadletter")
    pks = list(DeadLetter.objects.values_list("pk", flat=True))
    response = client.post("/admin/streams_app/deadletter/", {
        "action": "replay_selected", "_selected_action": [str(pks[0])], "select_across": "1", "post": "yes"},
        follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert not any("Nothing was changed" in m for m in shown), shown
    assert any("Replayed 400 dead letters before Redis failed" in m and "the other 50 were not replayed" in m
               for m in shown), shown
    assert LogEntry.objects.count() == 400
    assert DeadLetter.objects.count() == 50
