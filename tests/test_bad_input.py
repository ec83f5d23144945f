"""Bad input, all of it tried: every entry point refuses it with an error that says what was wrong,
and leaves Redis as it was.

Entry points: ``publish()``/``publish_many()`` and ``manage.py publish``; ``runconsumer`` (in this
process, and as real processes where only a process shows the behaviour); ``replay``; ``discover``;
the admin's URLs. Some cases are also tested next to their feature; here they are all in one place.
The limits these tests enforce are listed in README.md ("Limits").
"""
import io
import json
import os
import sys
import textwrap
from urllib.parse import quote

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from streams_app import publish, publish_many
from streams_app.conf import get_settings
from streams_app.exceptions import PublishError
from tests.streams_app.admin.fixtures import dead_letter

pytestmark = pytest.mark.both_redis

LIMIT = get_settings()["MAX_PAYLOAD_BYTES"]


def snapshot(redis):
    """Every key with its type and size: "no damage" means this did not change.

    SCAN, not KEYS: on a cluster KEYS asks one node, scan_iter every node."""
    sizes = {"stream": redis.xlen, "string": redis.strlen, "list": redis.llen, "hash": redis.hlen,
             "set": redis.scard, "zset": redis.zcard}
    return {key: (kind, sizes[kind](key)) for key in redis.scan_iter("*") for kind in [redis.type(key)]}


# -- publish ------------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [123, None, b"jobs", "", "   ", "a{b}c"])
def test_publish_refuses_a_stream_name_that_is_not_a_usable_string(redis, stream):
    with pytest.raises(PublishError, match="stream name"):
        publish(stream, {"n": 1})
    with pytest.raises(PublishError, match="stream name"):
        publish_many(stream, [{"n": 1}])
    assert snapshot(redis) == {}


@pytest.mark.parametrize("payload", [{"set": {1, 2}}, float("nan"), {"inf": float("inf")}, object(), {1j: "x"}])
def test_publish_refuses_a_payload_that_is_not_json(redis, payload):
    # The message names the key path of the offending value: payload["set"]: set is not JSON-serialisable
    with pytest.raises(PublishError, match=r"^payload(\[.*\])?: .*is not JSON-serialisable"):
        publish("jobs", payload)
    with pytest.raises(PublishError, match=r"^message 1: payload(\[.*\])?: .*is not JSON-serialisable"):
        publish_many("jobs", [{"n": 0}, payload, {"n": 2}])  # the good ones are not published either
    assert snapshot(redis) == {}


def test_publish_takes_a_payload_up_to_the_limit_and_refuses_one_byte_more(redis):
    at_limit = "é" * ((LIMIT - 2) // 2)  # 2 bytes each in UTF-8, plus the 2 quotes of the JSON string
    assert len(json.dumps(at_limit, ensure_ascii=False).encode()) == LIMIT
    publish("jobs", at_limit)
    with pytest.raises(PublishError, match=rf"payload is {LIMIT + 1} bytes, over the limit of {LIMIT} "
                                           r"\(STREAMS\['MAX_PAYLOAD_BYTES'\]\)"):
        publish("jobs", at_limit + "x")
    with pytest.raises(PublishError, match="message 1: payload is"):
        publish_many("jobs", [{"n": 0}, at_limit + "x"])
    assert redis.xlen("jobs") == 1


def test_publish_refuses_bad_keys_headers_and_maxlen(redis):
    for kwargs, error in [({"key": ""}, "key must be a non-empty string"), ({"key": 42}, "key must be"),
                          ({"headers": ["a"]}, "headers must be a dict"), ({"headers": {"a": {1}}}, "headers are not JSON"),
                          ({"maxlen": 0}, "maxlen must be a positive integer"), ({"maxlen": True}, "maxlen must be")]:
        with pytest.raises(PublishError, match=error):
            publish("jobs", {"n": 1}, **kwargs)
    with pytest.raises(PublishError, match="got 1 keys for 2 payloads"):
        publish_many("jobs", [{"n": 1}, {"n": 2}], keys=["k1"])
    assert snapshot(redis) == {}


def test_publish_to_a_key_holding_a_string_says_so_and_leaves_the_key(redis):
    redis.set("jobs", "precious")
    with pytest.raises(PublishError, match="Redis key 'jobs' holds a string, not a stream; nothing was published"):
        publish("jobs", {"n": 1})
    with pytest.raises(PublishError, match="holds a string, not a stream"):
        publish_many("jobs", [{"n": 1}, {"n": 2}])
    with pytest.raises(CommandError, match="nothing was published: Redis key 'jobs' holds a string"):
        call_command("publish", "jobs", '{"n": 1}')
    assert redis.get("jobs") == "precious" and snapshot(redis) == {"jobs": ("string", 8)}


def test_the_publish_command_reports_bad_input_and_publishes_nothing(redis, monkeypatch):
    cases = [
        (["jobs", "{not json"], "the JSON argument is not valid JSON"),
        (["jobs", "[1, 2"], "not valid JSON"),
        (["jobs", '"x"', "--headers", "[1]"], "--headers must be a JSON object"),
        (["jobs", '"x"', "--headers", "{bad"], "--headers is not valid JSON"),
        (["jobs", '"x"', "--maxlen", "-3"], "maxlen must be a positive integer"),
        (["jobs", json.dumps("x" * LIMIT)], f"over the limit of {LIMIT}"),
        (["jobs{1}", '"x"'], "must not contain"),
        (["jobs", "-", "--key", "k"], "--key names a single message"),
    ]
    for args, error in cases:
        monkeypatch.setattr(sys, "stdin", io.StringIO('{"n": 1}\n'))
        with pytest.raises(CommandError, match=error):
            call_command("publish", *args)
    # stdin: one bad line among good ones publishes none of them, and names the line.
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"n": 1}\n{"n": \n{"n": 3}\n'))
    with pytest.raises(CommandError, match="line 2 of stdin is not valid JSON"):
        call_command("publish", "jobs")
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n \n"))
    with pytest.raises(CommandError, match="stdin had no messages"):
        call_command("publish", "jobs")
    assert snapshot(redis) == {}


# -- runconsumer --------------------------------------------------------------------------------

@pytest.mark.parametrize("pool", [[], ["--workers", "2"], ["--min-workers", "1", "--max-workers", "3"]])
def test_runconsumer_refuses_an_unknown_group_or_stream_before_touching_redis(redis, pool):
    for selector, error in [("jobs:nope", r"no consumer is registered for 'jobs:nope'\. Registered: .*jobs:a"),
                            ("nosuch:a", "no consumer is registered for 'nosuch:a'"),
                            ("nocolon", "'nocolon' is not STREAM:GROUP")]:
        with pytest.raises(CommandError, match=error) as raised:
            call_command("runconsumer", selector, *pool)
        assert raised.value.returncode == 3  # EXIT_CONFIG: a supervisor (systemd) must not restart it
    assert snapshot(redis) == {}


def test_runconsumer_on_a_stream_key_holding_a_string_stops_and_leaves_the_key(redis):
    redis.set("jobs", "precious")
    with pytest.raises(CommandError, match="Redis key 'jobs' holds a string, not a stream") as raised:
        call_command("runconsumer", "jobs:a")
    assert raised.value.returncode == 3
    assert snapshot(redis) == {"jobs": ("string", 8)}


@pytest.mark.slow
def test_a_supervised_worker_on_a_stream_key_holding_a_string_halts_its_master(redis, run_consumer):
    redis.set("jobs", "precious")
    master = run_consumer("jobs:a", "--workers", "2", streams={"RESTART_DELAY": 0.1})
    assert master.wait(60) == 3, master.output()  # EXIT_BOOT_ERROR, not a respawn loop
    out = master.output()
    assert "holds a string, not a stream" in out and out.count("spawned worker") == 2
    assert snapshot(redis) == {"jobs": ("string", 8)}


@pytest.fixture
def broken_handler_app(tmp_path):
    """An installed app whose consumers.py cannot be imported (a dependency is missing)."""
    package = tmp_path / "brokenapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "consumers.py").write_text(textwrap.dedent("""\
        from streams_app import consumer
        import shoal_no_such_dependency

        @consumer("jobs", group="broken")
        def handle(message):
            shoal_no_such_dependency.run(message)
    """))
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
            "SHOAL_TEST_APPS": json.dumps(["brokenapp"]), "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.mark.slow
def test_runconsumer_with_a_handler_that_cannot_be_imported_names_it_and_consumes_nothing(redis, run_consumer,
                                                                                          broken_handler_app):
    """Django imports every consumers.py at start-up: Python's error, naming the file and line, exit 3.

    (Under a supervisor the worker fails to boot and the master halts with exit 3:
    tests/streams_app/supervisor/test_supervisor_process.py.)"""
    redis.xadd("jobs", {"payload": "{}"})
    before = snapshot(redis)
    proc = run_consumer("jobs:a", env=broken_handler_app)
    assert proc.wait(60) == 3  # a configuration error (docs/operations.md), not a crash to restart
    out = proc.output()
    assert "No module named 'shoal_no_such_dependency'" in out
    assert "brokenapp/consumers.py, line 2)" in out
    assert snapshot(redis) == before  # no group made, nothing read


# -- replay ---------------------------------------------------------------------------------------

def test_replay_of_ids_that_do_not_exist_or_are_malformed_changes_nothing(redis):
    [letter] = dead_letter(redis, [{"n": 1}])
    redis.xgroup_create("jobs", "b", id="$")
    before = snapshot(redis)
    err = io.StringIO()
    with pytest.raises(CommandError, match="none of the given ids could be replayed for group a"):
        call_command("replay", "jobs", "--group", "a", "--id", "1-0", "--id", "99999999999999-5", stderr=err)
    assert "1-0: skipped, not in the dead-letter stream" in err.getvalue()
    with pytest.raises(CommandError, match="none of the given ids"):
        call_command("replay", "jobs", "--group", "b", "--id", letter, stderr=err)
    assert f"{letter}: skipped, dead-lettered by another group" in err.getvalue()
    for bad in ["abc", "1-", "-1", "1-0; FLUSHALL", "+", "1-0-0", " 1-0"]:
        with pytest.raises(CommandError, match="not dead-letter entry ids: .* an id looks like 1700000000000-0"):
            call_command("replay", "jobs", "--group", "a", "--id", letter, "--id", bad)
    with pytest.raises(CommandError, match="--payload is not valid JSON"):
        call_command("replay", "jobs", "--group", "a", "--id", letter, "--payload", "{bad")
    with pytest.raises(CommandError, match="stream name"):
        call_command("replay", "jo{bs}", "--group", "a", "--all")
    with pytest.raises(CommandError, match="group 'a' does not exist on stream 'nosuch'"):
        call_command("replay", "nosuch", "--group", "a", "--all", verbosity=0)
    assert snapshot(redis) == before


def test_replay_where_the_stream_or_its_dead_letters_hold_a_string_says_so(redis):
    [letter] = dead_letter(redis, [{"n": 1}])
    redis.delete("jobs")
    redis.set("jobs", "precious")
    before = snapshot(redis)
    with pytest.raises(CommandError, match="cannot replay: 'jobs' holds a string, not a stream. Nothing was replayed"):
        call_command("replay", "jobs", "--group", "a", "--id", letter)
    redis.set("{orders}:dlq", "also precious")
    with pytest.raises(CommandError, match=r"'\{orders\}:dlq' holds a string"):
        call_command("replay", "orders", "--group", "a", "--all")
    assert snapshot(redis) == {**before, "{orders}:dlq": ("string", 13)}


# -- discover -----------------------------------------------------------------------------------

def test_discover_an_unknown_service_says_so_and_writes_nothing(redis):
    out = io.StringIO()
    call_command("discover", "nosuch", stdout=out)
    assert out.getvalue().strip() == "No live instance of nosuch."
    out = io.StringIO()
    call_command("discover", "nosuch", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {"service": "nosuch", "instances": []}
    for name in ["bad name", "a{b}", ""]:
        with pytest.raises(CommandError, match="service name"):
            call_command("discover", name)
    assert snapshot(redis) == {}


# -- the admin ----------------------------------------------------------------------------------

MALFORMED_IDS = ["abc", "1;DROP TABLE x", "-1", "0x10", "1.5", "99999999999999999999999999", "1-0", "..", "%00",
                 "<script>", "1 ", "é"]


def object_urls():
    """Every admin URL of the two apps that takes an object id, as (prefix, suffix)."""
    found = []
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label not in ("streams_app", "discovery_app"):
            continue
        for pattern in model_admin.get_urls():
            route = str(pattern.pattern)
            if route.startswith("<path:object_id>"):
                found.append((f"/admin/{model._meta.app_label}/{model._meta.model_name}/", route.split("/", 1)[1]))
    return found


def test_every_admin_url_with_a_malformed_or_unknown_id_is_a_404(client, db, redis):
    client.force_login(User.objects.create_superuser("root", password="x"))
    urls = object_urls()
    assert len(urls) >= 4 * 4  # change, delete, history and the redirect of each model, plus custom views
    wrong = []
    for prefix, suffix in urls:
        for bad in MALFORMED_IDS:
            url = prefix + quote(bad, safe="") + "/" + suffix
            for method in ("get", "post"):
                response = getattr(client, method)(url, follow=True)
                if response.status_code != 404:
                    wrong.append(f"{method.upper()} {url}: {response.status_code}")
    assert not wrong, "\n".join(wrong)
    assert snapshot(redis) == {}


@pytest.mark.parametrize("flags, error", [
    (["--workers", "2", "--min-workers", "1", "--max-workers", "3"], "not both"),
    (["--workers", "2", "--max-workers", "3"], "not both"),
    (["--min-workers", "1"], "--min-workers needs --max-workers"),
    (["--min-workers", "4", "--max-workers", "2"], r"--min-workers \(4\) is above --max-workers \(2\)"),
    (["--target-lag", "10"], "--target-lag only applies with --min-workers/--max-workers"),
    (["--workers", "2", "--target-lag", "10"], "--target-lag only applies"),
    (["--heartbeat-timeout", "5"], "needs a supervisor"),
    (["--shutdown-timeout", "-1"], r"--shutdown-timeout: invalid number of seconds \(0 or more\)"),
])
def test_runconsumer_contradictory_flags_are_configuration_errors(redis, flags, error):
    with pytest.raises(CommandError, match=error) as raised:
        call_command("runconsumer", "jobs:a", *flags)
    assert raised.value.returncode == 3  # EXIT_CONFIG, as the README's exit-code table says
    assert snapshot(redis) == {}


def test_replay_with_redis_unreachable_is_a_clear_error(run_consumer):
    from tests.redis_server import free_port

    proc = run_consumer("orders", "--group", "email", "--all", command="replay",
                        env={"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    assert proc.wait(timeout=60) == 1, proc.output()
    assert "Redis is unreachable" in proc.output() and "Traceback" not in proc.output(), proc.output()
