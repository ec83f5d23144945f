"""Bad input met by real processes (issues 22 and 23), on SQLite and on PostgreSQL.

``runreclaimer --once`` and ``runconsumer`` run as the README says, against the test Redis and a
migrated database of each engine (tests/databases.py; PostgreSQL tests skip when none answers).
"""
import json
import os
import signal

import pytest
import redis

from streams_app.redis import keys
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

FAST = {"PENDING_TIMEOUT_MS": 300, "CLAIM_INTERVAL_MS": 100, "RETRY_BACKOFF": 0.05}


@pytest.fixture
def run(run_consumer, process_database):
    """``manage.py <command>`` against the test Redis and ``process_database``."""
    return lambda command, *args, streams=None, env=None: run_consumer(
        *args, streams=streams, env={"DATABASE_URL": process_database.url, **(env or {})}, command=command)


def mirrored_letters(database):
    return dict(database.rows("SELECT entry_id, payload FROM streams_app_deadletter"))


def test_reclaimer_passes_over_undecodable_and_nul_bearing_dead_letters(redis_server, run, process_database):
    raw = redis.Redis(port=redis_server.port)  # bytes in, bytes out
    bad = raw.xadd("{failing}:dlq", {"payload": b"\xc3\x28 caf\xe9", "group": b"g", "error": b"decode: x"}).decode()
    nul = raw.xadd("{failing}:dlq", {"payload": b"id=7\x00name=x", "group": b"g", "error": b"decode: x"}).decode()
    raw.xgroup_create("jobs", "a", id="0", mkstream=True)  # sorted after "failing": must be copied all the same
    daemon = run("runreclaimer", "--once")
    assert daemon.wait(120) == 0, daemon.output()
    assert mirrored_letters(process_database) == {bad: "\\xc3( caf\\xe9", nul: "id=7\\x00name=x"}
    assert process_database.rows("SELECT s.name FROM streams_app_consumergroup g JOIN streams_app_stream s "
                                 "ON g.stream_id = s.id WHERE g.name = 'a'") == [("jobs",)]
    assert process_database.rows("SELECT error FROM streams_app_mirrorstate") == [("",)]


def test_a_handler_object_or_partial_does_not_break_the_reclaimer(redis, run, process_database):
    redis.xgroup_create("shapes", "object", id="0", mkstream=True)
    redis.xgroup_create("shapes", "partial", id="0")
    daemon = run("runreclaimer", "--once")
    assert daemon.wait(120) == 0, daemon.output()
    handlers = dict(process_database.rows("SELECT name, handler FROM streams_app_consumergroup"))
    assert handlers == {"object": "tests.testapp.consumers.CallableHandler instance",
                        "partial": "functools.partial(tests.testapp.consumers.behave)"}


def abandoned_at_its_limit(redis):
    """An entry of failing:g held by a consumer that is gone, at max_deliveries and idle past the timeout."""
    entry = redis.xadd("failing", {"payload": json.dumps({"n": 1})})
    redis.xgroup_create("failing", "g", id="0")
    redis.xreadgroup("g", "gone-consumer", {"failing": ">"})
    redis.xclaim("failing", "g", "gone-consumer", 0, [entry], retrycount=4)  # at max_deliveries=4
    wait_for(lambda: redis.xpending_range("failing", "g", "-", "+", 1, idle=FAST["PENDING_TIMEOUT_MS"]),
             timeout=10, what="the entry idle past the pending timeout")
    return entry


def test_reclaimer_skips_a_stream_key_of_another_type_audits_the_rest_and_says_so(redis, run, process_database):
    redis.set("jobs", "precious")
    entry = abandoned_at_its_limit(redis)
    daemon = run("runreclaimer", "--once", streams=FAST)
    assert daemon.wait(120) == 1, daemon.output()  # the pass did not audit jobs:a and jobs:b
    out = daemon.output()
    assert "the pass did not complete" in out and "Redis key 'jobs' holds a string, not a stream" in out
    assert "Traceback" not in out
    [(_, fields)] = redis.xrange(keys.dead_letter_key("failing"))  # the other groups were audited
    assert fields["shoal:origin_id"] == entry
    assert redis.get("jobs") == "precious"
    [(problem,)] = process_database.rows("SELECT problem FROM streams_app_stream WHERE name = 'jobs'")
    assert "holds a string, not a stream" in problem


def test_a_dead_letter_key_of_another_type_stops_the_start_with_exit_3(redis, run_consumer):
    redis.set("{failing}:dlq", "precious")
    worker = run_consumer("failing:g", streams=FAST)
    assert worker.wait(120) == 3, worker.output()
    out = worker.output()
    assert "Redis key '{failing}:dlq' (the dead letters of 'failing') holds a string, not a stream" in out, out
    assert "Traceback" not in out and redis.get("{failing}:dlq") == "precious"


def test_reclaimer_names_the_dead_letter_key_of_another_type(redis, run):
    redis.set("{failing}:dlq", "precious")
    abandoned_at_its_limit(redis)
    daemon = run("runreclaimer", "--once", streams=FAST)
    assert daemon.wait(120) == 1, daemon.output()
    out = daemon.output()
    assert "Redis key '{failing}:dlq' holds a string, not a stream" in out, out
    assert "Redis key 'failing' holds" not in out and "Traceback" not in out
    assert redis.get("{failing}:dlq") == "precious"
    assert redis.xpending("failing", "g")["pending"] == 1  # still pending: nothing lost


def test_runreclaimer_once_exits_non_zero_when_redis_is_unreachable(run):
    daemon = run("runreclaimer", "--once", env={"REDIS_URL": "redis://127.0.0.1:1/0"})
    assert daemon.wait(120) == 1, daemon.output()
    assert "the pass did not complete" in daemon.output()


def test_db_guard_never_acks_work_its_transaction_rolled_back(redis, run, process_database):
    """Four keyed messages each insert a shared Tag "if missing" with the IntegrityError caught and no
    savepoint. Only the first can commit; the others' transactions are marked for rollback, so they
    must fail (and end in the dead letters), not be acked with nothing committed."""
    for n in range(4):
        redis.xadd("dbshared", {"payload": json.dumps({"name": f"order-{n}"}), "key": f"order-{n}"})
    worker = run("runconsumer", "dbshared:d", streams=FAST)
    wait_for(lambda: (redis.xinfo_groups("dbshared") or [{}])[0].get("entries-read") == 4
             and redis.xpending("dbshared", "d")["pending"] == 0, timeout=120, what="every entry acked or dead-lettered")
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    [(committed,)] = process_database.rows("SELECT name FROM testapp_effect")  # whichever thread was first
    assert process_database.rows("SELECT key FROM streams_app_processedmessage") == [(committed,)]
    letters = [f for _, f in redis.xrange(keys.dead_letter_key("dbshared"))]
    assert sorted(json.loads(f["payload"])["name"] for f in letters) == sorted({f"order-{n}" for n in range(4)} - {committed})
    assert all(f["shoal:error"].startswith("TransactionRolledBack:") and "transaction.atomic()" in f["shoal:error"]
               for f in letters), letters[0]["shoal:error"]


def test_db_guard_with_the_savepoint_rule_commits_every_message(redis, run, process_database):
    for n in range(4):
        redis.xadd("dbsavepoint", {"payload": json.dumps({"name": f"order-{n}"}), "key": f"order-{n}"})
    worker = run("runconsumer", "dbsavepoint:d", streams=FAST)
    wait_for(lambda: (redis.xinfo_groups("dbsavepoint") or [{}])[0].get("entries-read") == 4
             and redis.xpending("dbsavepoint", "d")["pending"] == 0, timeout=120, what="every entry acked")
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    assert len(process_database.rows("SELECT name FROM testapp_effect")) == 4
    assert redis.xlen(keys.dead_letter_key("dbsavepoint")) == 0


def test_db_guard_never_acks_a_transaction_postgresql_aborted(redis, run_consumer, postgres_database):
    """A failed raw SELECT, or an ORM read, caught with no savepoint: PostgreSQL aborts the transaction
    (InFailedSqlTransaction) and COMMIT silently rolls back, though Django never marked it for rollback.
    The entries must fail and end in the dead letters, not be acked with nothing committed."""
    for n, orm in enumerate((False, True, False, True)):
        redis.xadd("dbaborted", {"payload": json.dumps({"name": f"order-{n}", "orm": orm}), "key": f"order-{n}"})
    worker = run_consumer("dbaborted:d", streams=FAST, env={"DATABASE_URL": postgres_database.url})
    wait_for(lambda: (redis.xinfo_groups("dbaborted") or [{}])[0].get("entries-read") == 4
             and redis.xpending("dbaborted", "d")["pending"] == 0, timeout=120, what="every entry acked or dead-lettered")
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    assert postgres_database.rows("SELECT name FROM testapp_effect") == []
    assert postgres_database.rows("SELECT key FROM streams_app_processedmessage") == []
    letters = [f for _, f in redis.xrange(keys.dead_letter_key("dbaborted"))]
    assert sorted(json.loads(f["payload"])["name"] for f in letters) == [f"order-{n}" for n in range(4)]
    assert all(f["shoal:error"].startswith("TransactionRolledBack:") and "aborted" in f["shoal:error"]
               for f in letters), letters[0]["shoal:error"]


ADMIN_PROBE = """
import json, os
from django.contrib.auth.models import User
from django.test import Client
from streams_app.admin import mirror
mirror.sync_all()
User.objects.create_superuser("probe", "probe@example.com", "pw")
client = Client(HTTP_HOST="localhost")
client.force_login(User.objects.get(username="probe"))
responses = {url: client.get(url) for url in json.loads(os.environ["PROBE_URLS"])}
print(json.dumps({url: [r.status_code, os.environ["PROBE_FIND"] in r.content.decode()] for url, r in responses.items()}))
"""


def test_admin_dead_letter_filters_holding_nul_do_not_fail_on_postgresql(redis_server, postgres_database):
    """PostgreSQL text cannot hold NUL: a filter value with one used to reach the query (DataError, 500).
    The mirror stores NUL as the text \\x00, so the filter looks for that and finds the letter."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    raw = redis.Redis(port=redis_server.port)
    letter = raw.xadd("{jobs}:dlq", {"payload": b'{"n": 1}', "shoal:group": b"a\x00b", "shoal:error": b"Boom\x00: x"}).decode()
    urls = ["/admin/streams_app/deadletter/?stream=%00", "/admin/streams_app/deadletter/?group=a%00",
            "/admin/streams_app/deadletter/?error_type=%00", "/admin/streams_app/deadletter/?group=a%00b"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url,
           "DATABASE_URL": postgres_database.url, "PROBE_URLS": json.dumps(urls),
           "PROBE_FIND": letter}
    probe = subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-c", ADMIN_PROBE],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert json.loads(probe.stdout.strip().splitlines()[-1]) == {
        **{url: [200, False] for url in urls[:3]}, urls[3]: [200, True]}, probe.stderr[-3000:]  # a%00b finds it
    assert postgres_database.rows("SELECT \"group\" FROM streams_app_deadletter") == [("a\\x00b",)]


def test_publish_whose_connection_is_killed_mid_batch_names_the_lines_in_doubt(redis, redis_server):
    """CLIENT PAUSE holds the first batch's MULTI/EXEC; CLIENT KILL then cuts the connection under it.
    The command must not claim "nothing was published": it names the batch that may have been stored."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_server.url}
    redis.client_pause(60_000, all=False)
    try:
        proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "publish", "jobs", "-"], cwd=ROOT, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdin.write("\n".join(json.dumps({"n": n}) for n in range(2500)) + "\n")
        proc.stdin.close()
        [client] = wait_for(lambda: [c for c in redis.client_list() if "x" in c["flags"]], timeout=60,
                            what="the publish command's MULTI held by the pause")
        redis.client_kill_filter(_id=client["id"])
    finally:
        redis.client_unpause()
    assert proc.wait(60) == 1
    err = proc.stderr.read()
    assert "nothing was published" not in err and "Traceback" not in err, err
    assert "published 0 of 2500 messages" in err
    assert "lines 1-1000 may or may not have been stored" in err and "XRANGE jobs - +" in err
    assert "nothing after line 1000 was published" in err and "tail -n +1" in err
    assert redis.xlen("jobs") == 0  # what the pause held was never run


def test_a_consumer_name_that_is_not_utf8_does_not_stop_the_reclaimer(redis_server, run):
    """Another client reads a group under a name that is not UTF-8 (issue 33, F1): the pass completes,
    the name that holds an entry keeps its liveness record, a lapsed one is forgotten and logged escaped."""
    raw = redis.Redis(port=redis_server.port)  # bytes in, bytes out
    raw.xadd("failing", {"payload": json.dumps({"n": 1})})
    raw.xgroup_create("failing", "g", id="0")
    raw.xreadgroup("g", b"\xffc", {"failing": ">"}, count=1)
    raw.hset(keys.liveness_key("failing"), mapping={b"\xffc": 1, b"\xfed": 1})  # deadlines long lapsed
    daemon = run("runreclaimer", "--once")
    assert daemon.wait(120) == 0, daemon.output()
    out = daemon.output()
    assert "Traceback" not in out and "\\xfed" in out, out
    assert raw.hgetall(keys.liveness_key("failing")) == {b"\xffc": b"1"}
    assert raw.xpending("failing", "g")["pending"] == 1


def queue_replay_job(database, stream, group):
    # As the admin's "Replay all dead letters" queues one (a group is named as the mirror shows it).
    database.rows('INSERT INTO streams_app_replayjob (stream, "group", requested_by, state, created_at, scanned, '
                  "total, replayed, skipped, error) VALUES (%s, %s, '', 'queued', CURRENT_TIMESTAMP, 0, 0, 0, 0, '') RETURNING id",
                  (stream, group))


def test_a_group_whose_name_is_not_utf8_stops_neither_the_reclaimer_nor_its_replay_jobs(redis_server, run,
                                                                                        process_database):
    """Another client's group named in raw bytes on the stream (issue 33 trial t33, F1): each replay job
    runs, the raw group's own included, and the daemon exits 0 after each pass."""
    raw = redis.Redis(port=redis_server.port)  # bytes in, bytes out
    raw.xadd("orders", {"payload": b'{"order_id": 5000}'})
    for group in (b"email", b"grp\xff\xfe", b"points"):
        raw.xgroup_create("orders", group, id="0")
    raw.xreadgroup(b"grp\xff\xfe", b"c", {"orders": ">"}, count=1)
    dlq = keys.dead_letter_key("orders")
    letters = {group: raw.xadd(dlq, {"payload": b"{}", "shoal:origin_id": b"1-0", "shoal:group": group,
                                     "shoal:error": b"RuntimeError: x"})
               for group in (b"grp\xff\xfe", b"points")}
    queue_replay_job(process_database, "orders", "grp\\xff\\xfe")
    queue_replay_job(process_database, "orders", "points")
    for _ in letters:  # one job per pass
        daemon = run("runreclaimer", "--once")
        assert daemon.wait(120) == 0, daemon.output()
        assert "Traceback" not in daemon.output(), daemon.output()
    jobs = process_database.rows('SELECT "group", state, replayed, error FROM streams_app_replayjob ORDER BY id')
    assert jobs == [("grp\\xff\\xfe", "done", 1, ""), ("points", "done", 1, "")]
    assert raw.xlen(dlq) == 0
    targets = [fields[b"shoal:target_group"] for _, fields in raw.xrange("orders", min="(" + "1-0")
               if b"shoal:target_group" in fields]
    assert sorted(targets) == [b"grp\xff\xfe", b"points"]  # to the real groups, no name spelled with a backslash
    assert sorted(g["name"] for g in raw.xinfo_groups("orders")) == [b"email", b"grp\xff\xfe", b"points"]


def test_a_replay_job_that_cannot_run_ends_failed_with_the_reason_and_the_daemon_goes_on(redis_server, run,
                                                                                         process_database):
    """docs/admin.md: a job ends *done* or *failed* with the reason; whatever it meets, never the daemon's end."""
    queue_replay_job(process_database, "bad{name}", "a")
    daemon = run("runreclaimer", "--once")
    assert daemon.wait(120) == 0, daemon.output()
    [(state, error)] = process_database.rows("SELECT state, error FROM streams_app_replayjob")
    assert state == "failed" and "must not contain '{' or '}'" in error, error
