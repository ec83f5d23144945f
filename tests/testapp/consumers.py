"""Handlers whose behaviour the payload chooses, and which record what they did in Redis.

``started:<stream>:<group>`` and ``handled:<stream>:<group>`` are lists of entry ids (RPUSH), so a
test counts handlings and duplicates exactly. Payload keys: ``sleep`` (seconds), ``fail`` (raise).
"""
import asyncio
import functools
import os
import signal
import sys
import time
import zlib

from streams_app import consumer
from streams_app.redis.connection import get_connection


def record(kind, message):
    get_connection().rpush(f"{kind}:{message.stream}:{message.group}", message.id)


def behave(message):
    payload = message.payload if isinstance(message.payload, dict) else {}
    record("started", message)
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("fail"):
        raise RuntimeError(f"asked to fail: {payload.get('fail')}")
    record("handled", message)


consumer("jobs", group="a")(behave)
consumer("jobs", group="b")(behave)
consumer("queue:order-processing", group="workers")(behave)


@consumer("noop", group="bench")
def noop(message):
    pass


@consumer("sleepy", group="a")
def sleeps(message):
    """Sleeps and writes nothing: it runs while Redis refuses writes (maxmemory tests)."""
    time.sleep(message.payload.get("sleep", 0))


# -- failure handling (tests/streams_app/test_failures.py and friends) ------------------------

FAILING_CALLS = []  # (entry id, delivery, monotonic time): in-process loop tests read it


@consumer("failing", group="g", max_deliveries=4, retry_backoff=(0.2, 5))
def always_fails(message):
    FAILING_CALLS.append((message.id, message.deliveries, time.monotonic()))
    record("started", message)
    raise ValueError(f"cannot handle {message.payload!r}")


@consumer("suicide", group="g", max_deliveries=3)
def kills_its_process(message):
    """Dies mid-handler, as a segfault or the OOM killer would: no error is ever recorded."""
    record("started", message)
    os.kill(os.getpid(), signal.SIGKILL)


@consumer("exits", group="g", max_deliveries=3, retry_backoff=0.1)
def exits_its_process(message):
    """``exit``: os._exit(1) mid-handler, as a segfault or the OOM killer would; else a normal handler."""
    payload = message.payload if isinstance(message.payload, dict) else {}
    record("started", message)
    if payload.get("exit"):
        os._exit(1)
    record("handled", message)


def dies_or_runs(message):
    """``exit``: os._exit(1) mid-handler; ``sleep``: seconds. Appends "s <id> <pid>" as it starts and
    "h <id> <pid>" as it returns to ``events:<stream>`` (one list: the order across threads and workers)."""
    payload = message.payload if isinstance(message.payload, dict) else {}
    conn = get_connection()
    conn.rpush(f"events:{message.stream}", f"s {message.id} {os.getpid()}")
    record("started", message)
    if payload.get("exit"):
        os._exit(1)
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    record("handled", message)
    conn.rpush(f"events:{message.stream}", f"h {message.id} {os.getpid()}")


# The run ledger (tests/streams_app/consuming/test_worker_deaths.py).
consumer("exitsonce", group="g", max_deliveries=1, retry_backoff=0.1)(dies_or_runs)
consumer("exitsalone", group="g", max_deliveries=3, retry_backoff=0.1)(dies_or_runs)


@consumer("aexits", group="g", max_deliveries=3, retry_backoff=0.1)
async def dies_or_runs_async(message):
    """``dies_or_runs`` as an async def; ``sleep`` is an await."""
    payload = message.payload if isinstance(message.payload, dict) else {}
    conn = get_connection()
    await asyncio.to_thread(conn.rpush, f"events:{message.stream}", f"s {message.id} {os.getpid()}")
    await asyncio.to_thread(record, "started", message)
    if payload.get("exit"):
        os._exit(1)
    if payload.get("sleep"):
        await asyncio.sleep(payload["sleep"])
    await asyncio.to_thread(record, "handled", message)
    await asyncio.to_thread(conn.rpush, f"events:{message.stream}", f"h {message.id} {os.getpid()}")


consumer("aexitsonce", group="g", max_deliveries=1, retry_backoff=0.1)(dies_or_runs_async)


@consumer("idem", group="r", idempotent="redis", retry_backoff=0.05)
def idempotent_in_redis(message):
    behave(message)


@consumer("idemonce", group="r", idempotent="redis", max_deliveries=1, retry_backoff=(0.05, 5))
def idempotent_in_redis_once(message):
    behave(message)


@consumer("dbjobs", group="d", idempotent="db")
def idempotent_in_db(message):
    """Writes an Effect row; ``die_after_commit`` SIGKILLs the worker after the commit, before the ack."""
    from django.db import transaction

    from tests.testapp.models import Effect

    record("started", message)
    Effect.objects.create(name=message.payload["name"], entry_id=message.id)
    if message.payload.get("die_after_commit") and message.deliveries == 1:
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))


@consumer("dbshared", group="d", idempotent="db", max_deliveries=2, retry_backoff=(0.05, 0.1))
def inserts_a_shared_tag_if_missing(message):
    """The "insert if missing" of the db guard's savepoint rule: catches IntegrityError with no
    savepoint around the insert, which leaves the guard's transaction marked for rollback."""
    from django.db import IntegrityError

    from tests.testapp.models import Effect, Tag

    Effect.objects.create(name=message.payload["name"], entry_id=message.id)
    try:
        Tag.objects.create(name="shared")
    except IntegrityError:
        pass


@consumer("dbsavepoint", group="d", idempotent="db")
def inserts_a_shared_tag_in_a_savepoint(message):
    """The same, done right: the insert that may fail has a savepoint of its own."""
    from django.db import IntegrityError, transaction

    from tests.testapp.models import Effect, Tag

    Effect.objects.create(name=message.payload["name"], entry_id=message.id)
    try:
        with transaction.atomic():
            Tag.objects.create(name="shared-savepoint")
    except IntegrityError:
        pass


@consumer("dbaborted", group="d", idempotent="db", max_deliveries=2, retry_backoff=(0.05, 0.1))
def catches_a_failed_statement(message):
    """Catches a failed raw SELECT (or ORM read) with no savepoint: on PostgreSQL the transaction is
    aborted (InFailedSqlTransaction) without Django's needs_rollback, and COMMIT silently rolls back."""
    from django.db import connection
    from django.db.models.expressions import RawSQL

    from tests.testapp.models import Effect

    Effect.objects.create(name=message.payload["name"], entry_id=message.id)
    try:
        if message.payload.get("orm"):
            list(Effect.objects.annotate(x=RawSQL("1 / (id - id)", [])))
        else:
            with connection.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_table")
    except Exception:
        pass


class CallableHandler:
    """A handler that is an object with __call__, not a function (handler shapes, issue 22)."""

    def __call__(self, message):
        behave(message)


consumer("shapes", group="object")(CallableHandler())
consumer("shapes", group="partial")(functools.partial(behave))

# A single delivery: any takeover of a live handler's entry dead-letters it (issue 13, item 1).
consumer("slow", group="once", max_deliveries=1)(behave)

consumer("ledger", group="fast", retention="acked")(behave)
consumer("ledger", group="slow")(behave)


# -- the chaos run (tests/chaos) ---------------------------------------------------------------

CHAOS_STREAM = "chaos"


def chaos_fails(key):
    """A deterministic 1% of keys: the same in every process, every run (not Python's salted hash)."""
    return zlib.crc32(key.encode()) % 100 == 0


@consumer(CHAOS_STREAM, group="effects", idempotent="db", retry_backoff=(0.05, 1))
def chaos_effect(message):
    """One Effect row per key, written in the same transaction as the ProcessedMessage guard."""
    from tests.testapp.models import Effect

    Effect.objects.create(name=message.key, entry_id=message.id)


@consumer(CHAOS_STREAM, group="flaky", max_deliveries=3, retry_backoff=(0.05, 1))
def chaos_flaky(message):
    if chaos_fails(message.key):
        raise RuntimeError(f"key {message.key} always fails")
    get_connection().hincrby("chaos:flaky:handled", message.key, 1)


# -- a handler that starts a subprocess (tests/streams_app/supervisor/test_pid1.py) ----------

def host_pid():
    """This process's pid as the host sees it (the tests' /proc is the host's, even in a PID namespace)."""
    with open("/proc/self/stat") as stat:
        return int(stat.read().split()[0])


@consumer("spawns", group="g")
def spawns_a_subprocess(message):
    directory = message.payload["dir"]
    with open(os.path.join(directory, "worker.pid"), "w") as out:
        out.write(str(host_pid()))
    # The child writes its own host pid, then lives a little longer than its worker will.
    import subprocess
    subprocess.Popen(["sh", "-c", f'read pid rest < /proc/self/stat; echo $pid > "{directory}/child.pid.tmp"; '
                      f'mv "{directory}/child.pid.tmp" "{directory}/child.pid"; exec sleep 2'])
    time.sleep(300)


# -- async handlers and handler shapes (tests/streams_app/consuming/test_async_processes.py) -----

async def abehave(message):
    """``behave`` as an async def: the Redis writes go to a thread, the sleep is an await."""
    payload = message.payload if isinstance(message.payload, dict) else {}
    await asyncio.to_thread(record, "started", message)
    if payload.get("sleep"):
        await asyncio.sleep(payload["sleep"])
    if payload.get("fail"):
        raise RuntimeError(f"asked to fail: {payload.get('fail')}")
    await asyncio.to_thread(record, "handled", message)


consumer("ajobs", group="a", max_deliveries=3, retry_backoff=0.05)(abehave)
consumer("aidem", group="r", idempotent="redis", retry_backoff=0.05)(abehave)


@consumer("aorm", group="g")
async def async_orm_effect(message):
    """One Effect row through Django's async ORM; the ack must come after the row exists."""
    from tests.testapp.models import Effect

    await asyncio.to_thread(record, "started", message)
    if message.payload.get("sleep"):
        await asyncio.sleep(message.payload["sleep"])
    await Effect.objects.acreate(name=message.payload["name"], entry_id=message.id)
    await asyncio.to_thread(record, "handled", message)


def _returns_a_coroutine(message):
    """A sync wrapper around an async def: calling it runs nothing (the coroutine is never awaited)."""
    return abehave(message)


consumer("coro", group="g", max_deliveries=2, retry_backoff=0.05)(_returns_a_coroutine)


class BadStr(Exception):
    """An exception that formats an attribute it does not have: its __str__ raises."""

    def __str__(self):
        return f"order {self.order_id} failed"


NOT_UTF8_NAME = os.fsdecode(b"report-\xff.csv")  # "report-\udcff.csv"
NOT_UTF8_DIR = os.fsdecode(b"in-\xfe")


def _raise_what_is_asked(message):
    record("started", message)
    kind = message.payload.get("raise")
    if kind == "SystemExit":
        sys.exit(4)
    if kind == "KeyboardInterrupt":
        raise KeyboardInterrupt
    if kind == "GeneratorExit":
        raise GeneratorExit
    if kind == "BadStr":
        raise BadStr()
    if kind == "Surrogate":  # a file name that is not UTF-8, as os.fsdecode gives it: a lone surrogate
        raise ValueError(f"cannot parse {NOT_UTF8_NAME}")
    if kind == "SurrogateTraceback":  # the surrogate only in the chained cause, so only in the traceback
        try:
            raise OSError(f"no such file {NOT_UTF8_DIR}")
        except OSError as exc:
            raise RuntimeError("could not read the report") from exc
    record("handled", message)


consumer("raises", group="g", max_deliveries=2, retry_backoff=0.05)(_raise_what_is_asked)
consumer("raisesr", group="g", max_deliveries=2, retry_backoff=0.05, idempotent="redis")(_raise_what_is_asked)


@consumer("araises", group="g", max_deliveries=2, retry_backoff=0.05)
async def async_raise_what_is_asked(message):
    _raise_what_is_asked(message)


# -- payload types (tests/streams_app/test_payload_types.py) -------------------------------------

def _described(value):
    """JSON-able [type, repr] of every value, nested ones included: what the handler really got."""
    if isinstance(value, dict):
        return {k: _described(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_described(v) for v in value]
    return [type(value).__name__, repr(value)]


@consumer("typed", group="g", max_deliveries=1)
def records_payload_types(message):
    """Records the payload as it reached it (types and reprs); fails while ``typed:fail`` is set."""
    import json

    conn = get_connection()
    failing = conn.exists("typed:fail")  # decided before recording: a test sets it again once it saw the record
    conn.rpush("typed:seen", json.dumps(_described(message.payload)))
    if failing:
        raise RuntimeError("asked to fail by typed:fail")


@consumer("atyped", group="g")
async def records_payload_types_async(message):
    """The same record from an async handler: the payload is decoded before the coroutine runs."""
    import json

    await asyncio.to_thread(get_connection().rpush, "typed:seen", json.dumps(_described(message.payload)))


# -- the slow chaos run (tests/chaos/test_slow_chaos.py) ---------------------------------------------

SLOW_CHAOS_STREAM = "slowchaos"


def _pause(message):
    seconds = message.payload.get("sleep") if isinstance(message.payload, dict) else None
    if seconds:
        time.sleep(seconds)


# Sleeps and writes nothing to Redis: it runs at maxmemory (test_delivery_guarantees.py).
consumer("quiet", group="a")(_pause)


@consumer(SLOW_CHAOS_STREAM, group="db", idempotent="db", max_deliveries=50, retry_backoff=(0.2, 1))
def slow_chaos_db(message):
    """One Effect row per key, after a pause that may outlast the pending timeout."""
    from tests.testapp.models import Effect

    _pause(message)
    Effect.objects.create(name=message.key, entry_id=message.id)


@consumer(SLOW_CHAOS_STREAM, group="redis", idempotent="redis", max_deliveries=50, retry_backoff=(0.2, 1))
def slow_chaos_redis(message):
    _pause(message)
    get_connection().hincrby("slowchaos:redis:handled", message.key, 1)


@consumer(SLOW_CHAOS_STREAM, group="plain", max_deliveries=50, retry_backoff=(0.2, 1))
def slow_chaos_plain(message):
    _pause(message)
    get_connection().hincrby("slowchaos:plain:handled", message.key, 1)


# -- the transactional outbox (tests/streams_app/outbox) ---------------------------------------

@consumer("outbox-orders", group="effects", idempotent="db")
def outbox_order_effect(message):
    """One Effect row per message key, in the guard's transaction: a relay's re-send makes none."""
    from tests.testapp.models import Effect

    Effect.objects.create(name=message.payload["order"], entry_id=message.id)

# -- partitioned streams (tests/streams_app/test_partitions.py; STREAMS["PARTITIONS"] there) ----

consumer("orders", group="p", max_deliveries=2, retry_backoff=0.05)(behave)


@consumer("failover", group="f", retry_backoff=0.05)
def record_outside_redis(message):
    """Appends "stream id" to a file of this process (tests/streams_app/test_failover.py): the record of
    what was handled must not live in the Redis being failed over, where an un-replicated write may vanish."""
    path = f"{os.environ['SHOAL_TEST_RECORD_FILE']}.{os.getpid()}"
    with open(path, "a") as out:
        out.write(f"{message.stream} {message.id}\n")



_blocker = {"waiting": False}
_wake = asyncio.Event()  # bound to the worker's event loop on first use


@consumer("ablock", group="g", max_deliveries=2, retry_backoff=(0.2, 0.5))
async def blocks_the_event_loop(message):
    """``block``: wait for a ``wake`` message, then block the whole event loop (a sync call in an
    async def) until the key ``release:ablock`` exists. ``wake`` waits until the blocker waits and
    ``after`` others were handled (with idempotent="redis" each chunk's admission is a thread's round
    trip, so the others may still be queued behind it), then sets the event and returns at once: the
    blocker's wake-up is queued before the waker's own completion, as when any coroutine that blocks
    happens to run right after a handler returns. Other payloads are handled at once."""
    payload = message.payload
    conn = get_connection()
    # Released: a takeover after the test just finishes (its count may still be 1: a death beside other
    # runs is charged to nobody, docs/failures.md).
    if payload.get("block") and not conn.exists(f"release:{message.stream}"):
        _blocker["waiting"] = True
        await _wake.wait()
        record("started", message)
        deadline = time.monotonic() + 120
        while not conn.exists(f"release:{message.stream}") and time.monotonic() < deadline:
            time.sleep(0.05)  # blocking: no other coroutine of this process runs meanwhile
        return
    if payload.get("wake"):
        handled = f"handled:{message.stream}:{message.group}"
        while not _blocker["waiting"] or conn.llen(handled) < payload.get("after", 0):
            await asyncio.sleep(0.01)
        record("handled", message)
        _wake.set()
        return  # nothing awaited between the set and the return
    record("handled", message)


consumer("ablockr", group="g", idempotent="redis", max_deliveries=2, retry_backoff=(0.2, 0.5))(blocks_the_event_loop)


@consumer("acancel", group="g", max_deliveries=2, retry_backoff=0.05)
async def cancels_its_own_task(message):
    record("started", message)
    asyncio.current_task().cancel()
    await asyncio.sleep(0.1)


@consumer("aforgot", group="g", max_deliveries=2, retry_backoff=0.05)
async def forgets_an_await(message):
    record("started", message)
    return asyncio.sleep(0)


@consumer("aspawn", group="g")
async def spawns_and_forgets(message):
    async def later():
        await asyncio.sleep(600)

    asyncio.get_running_loop().create_task(later())
    record("handled", message)


# -- ordered mode (tests/streams_app/consuming/test_ordered.py; STREAMS["PARTITIONS"] there) ---------

def _redis_ms(conn):
    seconds, micros = conn.time()
    return int(seconds) * 1000 + int(micros) // 1000


@consumer("ordered", group="o", ordered=True, max_deliveries=3, retry_backoff=0.05)
def records_its_order(message):
    """``seen:<key>`` gets the payload's ``n`` (RPUSH), and ``trace`` "partition consumer start end"
    (Redis clock, ms), so a test checks per-key order and that no two handlers of one partition overlapped;
    ``ordered-started`` gets "partition id" at every start.
    ``fail``: raise on deliveries below it; ``sleep``: seconds."""
    conn = get_connection()
    payload = message.payload
    conn.rpush("ordered-started", f"{message.stream} {message.id}")  # every start: a second run shows twice
    started = _redis_ms(conn)
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if message.deliveries < payload.get("fail", 0):
        raise RuntimeError(f"asked to fail delivery {message.deliveries}")
    conn.rpush(f"seen:{payload['key']}", payload["n"])
    conn.rpush("trace", f"{message.stream} {message.consumer} {started} {_redis_ms(conn)}")


consumer("single", group="o", ordered=True, retry_backoff=0.05)(records_its_order)


@consumer("aordered", group="o", ordered=True, retry_backoff=0.05)
async def records_its_order_async(message):
    """The async twin of records_its_order (``seen:<key>``; ``fail`` below a delivery count)."""
    await asyncio.sleep(0)
    if message.deliveries < message.payload.get("fail", 0):
        raise RuntimeError(f"asked to fail delivery {message.deliveries}")
    get_connection().rpush(f"seen:{message.payload['key']}", message.payload["n"])
consumer("iordered", group="o", ordered=True, idempotent="redis", retry_backoff=0.05)(records_its_order)


def records_its_deliveries(message):
    """records_its_order, and ``deliveries:<key>`` gets "n:deliveries" of every run (failed or not)."""
    get_connection().rpush(f"deliveries:{message.payload['key']}", f"{message.payload['n']}:{message.deliveries}")
    records_its_order(message)


consumer("oonce", group="o", ordered=True, max_deliveries=1, retry_backoff=0.05)(records_its_deliveries)
consumer("othrice", group="o", ordered=True, max_deliveries=3, retry_backoff=0.05)(records_its_deliveries)
# A back-off a test can act within: a failed entry waits in the PEL that long (test_ordered.py).
consumer("owaits", group="o", ordered=True, retry_backoff=1)(records_its_order)


# -- deferred messages (tests/streams_app/test_scheduled.py, consuming/test_deferred_processes.py) -----

def record_run(message):
    """Appends to ``deferred:runs`` one JSON record per run: the scheduled id, when it was due (ms, Redis
    clock), when the handler started (ms, this host's clock: the tests' Redis runs on the same host)."""
    import json

    get_connection().rpush("deferred:runs", json.dumps({
        "id": message.scheduled_id, "due": message.run_after, "at": time.time() * 1000, "entry": message.id,
        "stream": message.stream, "key": message.key}))


consumer("deferred", group="g")(record_run)


@consumer("deferreddb", group="d", idempotent="db")
def deferred_effect(message):
    """One Effect row per message key, in the guard's transaction (each deferred message has a key of its own)."""
    from tests.testapp.models import Effect

    record_run(message)
    Effect.objects.create(name=message.key, entry_id=message.id)


@consumer("gcfrozen", group="g")
def records_how_many_objects_are_frozen(message):
    import gc

    get_connection().rpush("gc:frozen", gc.get_freeze_count())


# -- runconsumer --burst across groups (tests/streams_app/consuming/test_burst.py) -----------------

@consumer("chain1", group="c")
def publishes_on_after_a_while(message):
    """Publishes to chain2 after the chain2 loop has long read nothing: a burst must still handle it."""
    from streams_app import publish

    time.sleep(message.payload.get("sleep", 0))
    publish("chain2", {"from": message.id})


consumer("chain2", group="c")(behave)


@consumer("selffeed", group="g")
def feeds_its_own_stream(message):
    """Every message publishes the next one: a burst of it never runs out of work."""
    from streams_app import publish

    publish("selffeed", {"n": message.payload.get("n", 0) + 1})
