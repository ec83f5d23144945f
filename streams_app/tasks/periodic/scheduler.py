"""Enqueueing the ticks of periodic tasks: every ``runconsumer`` that runs a queue schedules its periodic
tasks, with no beat process and no leader (docs/tasks.md "Periodic tasks").

Each tick is enqueued exactly once, however many schedulers run, by one script (lua/periodic_claim.lua)
that does three things or none: it compares the tick with the newest tick enqueued (the claim hash
``{<stream>}:periodic:<alias>:<name>``, field ``tick``), and only when the tick is newer it records it there,
appends the task message to the queue's stream and writes the READY result. Redis runs a script whole
and one at a time, so:

- *never twice*: of schedulers racing on a tick, the first script records it; every later one finds it
  recorded (or a newer tick) and writes nothing;
- *never lost*: a scheduler SIGKILLed at any moment either had its script run (the tick is enqueued, the
  message in the stream, where at-least-once delivery takes over) or not (nothing of it is written, and
  the next scheduler's pass, on any host, finds the tick unrecorded and enqueues it: a tick up to
  LATE_AFTER old is on time, older ones follow ``catch_up``).

The result id of a tick is derived from (alias, name, tick), not drawn: the Tasks page links a
schedule's last tick to its result, and on a cluster, where the result is in another slot than the claim
and is written just after the script (lua/periodic_result.lua, only while there is none), a retaking
scheduler and the worker that runs the message name the same result.

``Scheduler.tick(now)`` is one pass (the runconsumer supervisor calls it about once a second; tests
call it with an injected clock); ``run_now(entry)`` enqueues one extra run (the Schedules page).
"""
import hashlib
import logging
import time

from asgiref.sync import iscoroutinefunction

from shoal_common.text import to_text
from streams_app.redis import keys, scripts
from streams_app.partitioning import partitions
from streams_app.redis.connection import TRANSIENT_ERRORS, get_connection, is_cluster
from streams_app.exceptions import PublishError, RejectMessage
from streams_app.publishing.encoding import encode_message
from streams_app.tasks import messages, results
from streams_app.tasks.periodic.schedule import due, to_datetime

logger = logging.getLogger("streams_app.tasks.periodic")

LATE_AFTER = 10_000
"""Milliseconds a tick may be late and still count as on time (run whatever ``catch_up`` says): longer than
a supervisor's pass (1 s) and a slow Redis reply, so a tick a busy or retaking scheduler enqueues late is
not taken for one missed while nothing ran."""
CATCH_UP_LIMIT = 100
"""Missed ticks ``catch_up = "all"`` enqueues per schedule and pass; the rest follow on the next passes."""
OUTAGE_RETRY_MS = 5_000
"""While Redis does not answer, how long the scheduler waits before it asks again: each attempt may block its
caller (the supervisor's own loop) for the connection's timeout. A tick due meanwhile is late, not lost."""
RETRY_AFTER = 60.0
"""Seconds before a schedule whose task cannot be enqueued (its module fails to import now) is tried again."""


def result_id(entry, tick):
    """The result id of ``entry``'s run for ``tick``: the same in every scheduler."""
    digest = hashlib.sha256(f"periodic\0{entry.alias}\0{entry.name}\0{tick}".encode()).hexdigest()
    return "p" + digest[:31]


def _stream(entry, task):
    """The stream key the runs of ``entry`` go to: a partitioned queue's runs go to one partition per
    schedule (routed by the schedule's name), whose slot the claim hash shares."""
    logical = messages.stream_for(task.queue_name, task.priority, iscoroutinefunction(task.func))
    return partitions.route(logical, f"periodic:{entry.alias}:{entry.name}")


def claim_key(entry, task=None):
    stream = _stream(entry, task or entry.task())
    return f"{keys.hash_tag(stream)}:periodic:{entry.alias}:{entry.name}"


def _flat(mapping):
    return [part for pair in mapping.items() for part in pair]


def enqueue_tick(conn, entry, tick, now_ms=None):
    """Enqueue ``entry``'s run for ``tick`` (epoch ms) unless that tick or a later one was enqueued
    already. True when this call enqueued it, False when it was enqueued already, None when the tick has
    not come yet on the Redis clock (this host's clock runs ahead). The result's ``run_after`` is the tick's time."""
    task = entry.task().using(run_after=to_datetime(tick))
    backend = task.get_backend()
    result, logical, payload, record = backend._prepared(task, entry.args, entry.kwargs)
    rid = result_id(entry, tick)
    object.__setattr__(result, "id", rid)
    payload["id"] = record["id"] = rid
    # The message carries the tick's times too: on a cluster the READY result is written after the
    # claim, so a scheduler SIGKILLed in between, or a worker quicker than it, leaves the worker to
    # write the result from the message alone (runner.py), and run_after must still be the tick.
    payload["run_after"] = record["run_after"].isoformat()
    payload["enqueued_at"] = record["enqueued_at"].isoformat()
    partitions.ensure_recorded(conn, logical)
    stream = _stream(entry, task)
    claim = f"{keys.hash_tag(stream)}:periodic:{entry.alias}:{entry.name}"
    fields = _flat(results.encoded(record))
    ttl = backend.config["RESULT_TTL"]
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    cluster = is_cluster(conn)
    script_keys = [claim, stream] if cluster else [claim, stream, results.key(rid), results.index_key(task.queue_name)]
    reply = scripts.run(conn, "periodic_claim", script_keys,
                        [tick, rid, now_ms, ttl, len(fields), *fields, *_flat(encode_message(payload, key=rid))])
    if isinstance(reply, list):
        raise PublishError(f"Redis key {to_text(reply[1])!r} holds a {to_text(reply[2])}, not what the periodic task "
                           f"{entry.name!r} keeps there; nothing was enqueued and the key was left as it is.")
    if reply == 2:
        return None
    if not reply:
        return False
    if cluster:
        scripts.run(conn, "periodic_result", [results.key(rid)], [ttl, *fields])
        conn.zadd(results.index_key(task.queue_name), {rid: now_ms})
    backend._announce(result)  # counted, and task_enqueued sent, as for any enqueue
    return True


def last_tick(conn, entry, task=None):
    """The newest tick of ``entry`` enqueued (epoch ms), or None."""
    raw = conn.hget(claim_key(entry, task), "tick")
    return int(raw) if raw is not None else None


def status(conn, entry):
    """What the Schedules page shows of ``entry``: the claim hash's ``tick`` and ``id`` (the last tick
    enqueued and its result) and ``manual_id``/``manual_at`` (the last "Run now"), decoded."""
    raw = {to_text(name): to_text(value) for name, value in conn.hgetall(claim_key(entry)).items()}
    return {"tick": int(raw["tick"]) if raw.get("tick") else None, "id": raw.get("id"),
            "manual_id": raw.get("manual_id"), "manual_at": int(raw["manual_at"]) if raw.get("manual_at") else None}


def run_now(entry, conn=None):
    """Enqueue one run of ``entry`` now, besides its ticks (an ordinary enqueue, with a new result id);
    returns its TaskResult. The ticks are not moved."""
    result = entry.task().enqueue(*entry.args, **entry.kwargs)
    conn = conn if conn is not None else get_connection()
    try:
        conn.hset(claim_key(entry), mapping={"manual_id": result.id, "manual_at": int(time.time() * 1000)})
    except TRANSIENT_ERRORS:
        pass  # enqueued all the same; only the Schedules page's "last run" misses it
    return result


class Scheduler:
    """One pass, ``tick(now)``, enqueues what is due of ``entries``. A schedule's claim hash is read only
    when one of its ticks has come (``next_at``), so an idle pass asks Redis nothing."""

    def __init__(self, entries, *, clock=time.time, connection=get_connection,
                 late_after=LATE_AFTER, limit=CATCH_UP_LIMIT):
        self.entries = list(entries)
        self.clock = clock
        # A schedule that was never enqueued starts after this: a first start runs no ticks from before it.
        self.started = int(clock() * 1000)
        self.connection = connection
        self.late_after = late_after
        self.limit = limit
        self.next_at = {(entry.alias, entry.name): 0 for entry in self.entries}  # epoch ms; None: never again
        self.failing = False  # Redis did not answer: said once, until it does again
        self.retry_at = 0  # epoch ms: while failing, no pass before then

    def describe(self):
        return f"{len(self.entries)} periodic task{'s' if len(self.entries) != 1 else ''}: " + ", ".join(
            f"{entry.name} ({entry.schedule.describe()})" for entry in self.entries)

    def tick(self, now=None):
        """Enqueue the due ticks of every schedule; returns how many this pass enqueued."""
        now_ms = int((self.clock() if now is None else now) * 1000)
        if self.failing and now_ms < self.retry_at:
            return 0  # the supervisor's loop calls this every second: not a connect timeout in each pass
        enqueued = 0
        for entry in self.entries:
            wake = self.next_at[entry.alias, entry.name]
            if wake is None or now_ms < wake:
                continue
            try:
                enqueued += self.run_entry(entry, now_ms)
            except TRANSIENT_ERRORS as exc:
                if not self.failing:
                    logger.warning("Periodic: Redis did not answer (%s: %s); the due ticks are enqueued when it "
                                   "does", type(exc).__name__, exc)
                self.failing = True
                self.retry_at = now_ms + OUTAGE_RETRY_MS
                return enqueued
            except (RejectMessage, PublishError) as exc:
                logger.error("Periodic %s: cannot enqueue %s: %s; trying again in %.0f s", entry.name,
                             entry.task_path, exc, RETRY_AFTER)
                self.next_at[entry.alias, entry.name] = now_ms + int(RETRY_AFTER * 1000)
            except Exception:
                logger.exception("Periodic %s: enqueueing %s failed; trying again in %.0f s", entry.name,
                                 entry.task_path, RETRY_AFTER)
                self.next_at[entry.alias, entry.name] = now_ms + int(RETRY_AFTER * 1000)
        self.failing = False
        return enqueued

    def run_entry(self, entry, now_ms):
        conn = self.connection()
        task = entry.task()
        ticks = due(entry.schedule, last_tick(conn, entry, task), now_ms, entry.catch_up, self.late_after,
                    self.limit, since=self.started)
        enqueued, early = 0, False
        for tick in ticks:
            outcome = enqueue_tick(conn, entry, tick, now_ms)
            if outcome is None:  # this clock is ahead of Redis's: the tick waits for the next pass
                early = True
                break
            if outcome:
                enqueued += 1
                logger.info("Periodic %s: enqueued %s for %s (result %s)", entry.name, entry.task_path,
                            to_datetime(tick).isoformat(), result_id(entry, tick))
        # A capped catch-up, or a tick early on Redis's clock, goes on at the next pass; else nothing is due
        # before the next tick.
        again = early or len(ticks) >= self.limit
        self.next_at[entry.alias, entry.name] = now_ms if again else entry.schedule.next_after(now_ms)
        return enqueued


def for_specs(specs):
    """The Scheduler of the periodic tasks whose queue ``specs`` (runconsumer's consumers) read, or None
    when there are none: a runconsumer schedules what it runs."""
    from streams_app.tasks import api_available

    if not api_available():
        return None
    from streams_app.tasks.periodic.entries import entries
    from streams_app.tasks.setup import queues as queues_of, streams_backends

    read = {spec.logical for spec in specs if spec.group == messages.GROUP}
    run = {queue for _, params in streams_backends() for queue in queues_of(params)
           if any(messages.stream_for(queue, priority, is_async) in read
                  for priority in (1, 0, -1) for is_async in (False, True))}
    found = entries(run) if run else []
    return Scheduler(found) if found else None
