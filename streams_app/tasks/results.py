"""Task results in Redis: one hash per result id, kept RESULT_TTL seconds after its last write.

The public functions (stable: the admin and the metrics read results through them):

- ``key(result_id)``: the hash's key, ``shoal:task:{<id>}`` (the id is the cluster hash tag).
- ``valid_id(result_id)``: whether ``result_id`` has the shape of an id this backend makes.
- ``create(conn, record, ttl, pipeline=None)``: write a READY result (``record``: the fields below);
  ``encoded(record)``: the hash fields it writes.
- ``discard(conn, result_id, queue)``: remove it again, and its id from the queue's index.
- ``started(conn, result_id, worker_id, ttl)``: RUNNING, one more attempt by ``worker_id``; returns the
  record, or None (nothing written) when the result does not exist.
- ``finished(conn, result_id, status, ttl, return_json=None, error=None)``: SUCCESSFUL or FAILED (or
  READY again when the failure will be retried); ``error``: {"exception_class_path", "traceback"}.
- ``finished_then_started(conn, result_id, status, ttl, next_id, worker_id, next_ttl, ...)``: both in one
  round trip (a handler thread going on to its chunk's next task; not on a cluster).
- ``started_many(conn, result_ids, worker_id, ttls)`` / ``succeeded_many(conn, done)`` /
  ``unstarted_many(conn, begun, worker_id)``: a handler thread's chunk of attempts, one round trip each
  (streams_app/lua/task_*_many.lua; not on a cluster).
- ``get(conn, result_id)``: the record as a dict (decoded, see below), or None when unknown or expired.
- ``many(conn, result_ids)``: the records of ``result_ids`` in one round trip, in order (None for each
  unknown, expired or malformed id).
- ``claim_retry(conn, result_id)`` / ``retried(conn, result_id, new_id)`` / ``unclaim_retry(conn, result_id)``:
  the admin's one retry of a failed result (``retried_as`` in the record: the new result's id,
  ``RETRY_UNDER_WAY`` while it is being enqueued); see claim_retry.
- ``ids(conn, queue, limit=100)``: the newest result ids enqueued to ``queue`` (the per-queue index,
  a sorted set ``shoal:tasks:{queue}:results`` by enqueue time, pruned of ids older than the TTL).

A record: ``id, task, backend, queue, priority, takes_context, args, kwargs, status, enqueued_at,
run_after, started_at, last_attempted_at, finished_at`` (aware datetimes or None), ``worker_ids``
(one per attempt, in order: Django's ``attempts`` is their number), ``errors`` (one dict per failed
attempt) and ``return_value``.

Each attempt is numbered by HINCRBY and writes its own field (``worker.<n>``, ``error.<n>``), so two
workers running the same task (a takeover of a worker that was only slow) never lose each other's
entries in the lists. The start and the end of an attempt are one script each
(streams_app/lua/task_started.lua, task_finished.lua): one round trip apiece, the runner's only ones.
"""
import json
import re
import time
from datetime import datetime

from django.utils import timezone

from shoal_common.text import to_text
from streams_app.redis import scripts

_ID = re.compile(r"[A-Za-z0-9]{1,64}")
_TIMES = ("enqueued_at", "run_after", "started_at", "last_attempted_at", "finished_at")
_JSON = ("args", "kwargs", "return_value")


def key(result_id):
    return f"shoal:task:{{{result_id}}}"


def index_key(queue):
    return f"shoal:tasks:{{{queue}}}:results"


def valid_id(result_id):
    return isinstance(result_id, str) and _ID.fullmatch(result_id) is not None


def _now_iso():
    return timezone.now().isoformat()


_index_kept = {}  # index key -> when this process last trimmed it (time.time())


def create(conn, record, ttl, pipeline=None):
    """Write the READY result of ``record`` (a dict: id, task, backend, queue, priority,
    takes_context, args, kwargs, enqueued_at, run_after) and index it under its queue."""
    pipe = pipeline if pipeline is not None else conn.pipeline(transaction=False)
    result_key = key(record["id"])
    pipe.hset(result_key, mapping=encoded(record))
    pipe.expire(result_key, ttl)
    now = time.time()
    index = index_key(record["queue"])
    pipe.zadd(index, {record["id"]: int(now * 1000)})
    if index_trim_due(index, now):
        pipe.zremrangebyscore(index, "-inf", int(now * 1000) - ttl * 1000)
        pipe.expire(index, ttl)
    if pipeline is None:
        pipe.execute()


def index_trim_due(index, now):
    """Whether this write to ``index`` also trims its expired ids and pushes its own expiry back (and
    the caller then does): once a second per queue and process, not by every enqueue, so ids older
    than RESULT_TTL stay at most a second longer."""
    if now - _index_kept.get(index, 0) >= 1:
        _index_kept[index] = now
        return True
    return False


def encoded(record):
    """The hash fields of the READY result of ``record`` (as ``create`` writes them; the periodic
    scheduler writes them inside its claim script)."""
    fields = {"status": "READY", "attempts": 0, "errors": 0}
    for name, value in record.items():
        if name in _TIMES:
            fields[name] = value.isoformat() if value is not None else ""
        elif name in _JSON:
            fields[name] = json.dumps(value)
        else:
            fields[name] = json.dumps(value) if isinstance(value, bool) else str(value)
    return fields


def discard(conn, result_id, queue):
    """Undo ``create``: the READY result and its id in the queue's index (an enqueue whose publish failed)."""
    pipe = conn.pipeline(transaction=False)
    pipe.delete(key(result_id))
    pipe.zrem(index_key(queue), result_id)
    pipe.execute()


def started(conn, result_id, worker_id, ttl):
    """RUNNING: count one more attempt by ``worker_id``; returns the record after the write, or None
    (and writes nothing) when there is no result to start (not created yet, or expired)."""
    raw = scripts.run(conn, "task_started", [key(result_id)], [worker_id, _now_iso(), ttl])
    return _decode(result_id, _pairs(raw)) if raw else None


def finished(conn, result_id, status, ttl, return_json=None, error=None):
    """The end of an attempt: ``status`` SUCCESSFUL (with ``return_json``, the return value encoded), FAILED or READY (with
    ``error``, READY when it will be run again). Returns the record after the write, or None (and
    writes nothing) when the result is gone: expired, or Redis lost its data while the task ran."""
    raw = scripts.run(conn, "task_finished", [key(result_id)], _finish_args(status, ttl, return_json, error))
    return _decode(result_id, _pairs(raw)) if raw else None


def finished_then_started(conn, result_id, status, ttl, next_id, worker_id, next_ttl, return_json=None,
                          error=None):
    """``finished`` of ``result_id``, then ``started`` of ``next_id``, in one round trip (not on a
    cluster: the two keys are in different slots). Returns both records (either may be None)."""
    ttl_arg, error_arg, *fields = _finish_args(status, ttl, return_json, error)
    done, started_raw = scripts.run(conn, "task_next", [key(result_id), key(next_id)],
                                    [ttl_arg, error_arg, len(fields), *fields, worker_id, _now_iso(), next_ttl])
    return (_decode(result_id, _pairs(done)) if done else None,
            _decode(next_id, _pairs(started_raw)) if started_raw else None)


def started_many(conn, result_ids, worker_id, ttls):
    """``started`` of each of ``result_ids`` (one ttl each) in one round trip. Returns, per id, its
    (attempt number, errors so far); (0, 0) for a result that does not exist (nothing written)."""
    flat = scripts.run(conn, "task_started_many", [key(result_id) for result_id in result_ids],
                       [worker_id, _now_iso(), *ttls])
    return list(zip(flat[::2], flat[1::2]))


def succeeded_many(conn, done):
    """SUCCESSFUL for each (result_id, ttl, attempt, started_at, finished_at, return_value JSON) of
    ``done``, in one round trip. Returns, per entry, whether it was written (False: the result is gone)."""
    args = []
    for _result_id, ttl, attempt, started_at, finished_at, value in done:
        args += [ttl, attempt, started_at, finished_at, value]
    written = scripts.run(conn, "task_succeeded_many", [key(entry[0]) for entry in done], args)
    return [bool(flag) for flag in written]


def unstarted_many(conn, begun, worker_id):
    """Take back the attempts of (result_id, attempt) in ``begun`` that started_many counted and that did not
    run, while each is still the latest and ``worker_id``'s."""
    scripts.run(conn, "task_unstarted_many", [key(result_id) for result_id, _ in begun],
                [worker_id, *(attempt for _, attempt in begun)])


def _finish_args(status, ttl, return_json, error):
    fields = ["status", status]
    if status in ("SUCCESSFUL", "FAILED"):
        fields += ["finished_at", _now_iso()]
    if status == "SUCCESSFUL":
        fields += ["return_value", return_json]
    return [ttl, json.dumps(error) if error is not None else "", *fields]


def _pairs(flat):
    """A dict of HGETALL's flat reply, as a script returns it."""
    return dict(zip(flat[::2], flat[1::2]))


def get(conn, result_id):
    """The record of ``result_id``, or None (unknown, expired, or not an id at all)."""
    if not valid_id(result_id):
        return None
    return _decode(result_id, conn.hgetall(key(result_id)))


def many(conn, result_ids):
    """The records of ``result_ids`` (None for each unknown, expired or malformed one), one pipeline."""
    wanted = [result_id for result_id in result_ids if valid_id(result_id)]
    pipe = conn.pipeline(transaction=False)
    for result_id in wanted:
        pipe.hgetall(key(result_id))
    found = dict(zip(wanted, pipe.execute())) if wanted else {}
    return [_decode(result_id, found[result_id]) if result_id in found else None for result_id in result_ids]


COUNT_CHUNK = 1000  # results whose status one round trip of status_counts reads


def status_counts(conn, queue, statuses, budget=2.0, clock=None):
    """``(counts, counted, total)`` of the results in ``queue``'s index, newest first: ``counts`` by status
    (exact over the ``counted`` results still stored), ``total`` the index's size. One round trip per
    COUNT_CHUNK results, until the index is read or ``budget`` seconds have gone; ``counted < total``
    (less what expired) says the count stopped early."""
    import time

    clock = clock or time.monotonic
    index, deadline = index_key(queue), clock() + budget
    total = conn.zcard(index)
    counts, counted, start = dict.fromkeys(statuses, 0), 0, 0
    while start < total and clock() < deadline:
        ids = [to_text(member) for member in conn.zrevrange(index, start, start + COUNT_CHUNK - 1)]
        if not ids:
            break
        pipe = conn.pipeline(transaction=False)
        for result_id in ids:
            pipe.hget(key(result_id), "status")
        for status in pipe.execute():
            if status is not None:
                status = to_text(status)
                counts[status] = counts.get(status, 0) + 1
            counted += 1  # expired ones too: they are read, just no longer there to count
        start += len(ids)
    return counts, counted, total


RETRY_UNDER_WAY = "(being enqueued)"


def claim_retry(conn, result_id):
    """Claim the admin's retry of ``result_id``: "" when claimed now; else what it holds already (the
    new result's id, or RETRY_UNDER_WAY); None when the result is gone. A resubmitted confirmation
    (double click, browser resend) finds it claimed and enqueues nothing."""
    held = scripts.run(conn, "task_retry_claim", [key(result_id)], [RETRY_UNDER_WAY])
    return None if held is None else to_text(held)


def retried(conn, result_id, new_id):
    """Record on the failed result the id of the result its retry was enqueued as."""
    conn.hset(key(result_id), "retried_as", new_id)


def cancel(conn, result_id, error, ttl):
    """Mark the READY result ``result_id`` FAILED with ``error``, never to start (task_cancel.lua). True
    when it is cancelled (now or before); False when it runs, ran, or does not exist."""
    return bool(scripts.run(conn, "task_cancel", [key(result_id)], [_now_iso(), json.dumps(error), ttl]))


def unclaim_retry(conn, result_id):
    """Release a claim whose enqueue did not happen, so the retry can be asked again."""
    conn.hdel(key(result_id), "retried_as")


def ids(conn, queue, limit=100, start=0):
    """The newest ``limit`` result ids enqueued to ``queue`` from rank ``start`` (0: the newest; some may
    have expired since)."""
    return [to_text(member) for member in conn.zrevrange(index_key(queue), start, start + limit - 1)]


def _decode(result_id, raw):
    # The runner decodes two records per task: one decode per field, not a to_text call per name and value.
    fields = {(name.decode() if isinstance(name, bytes) else name): (value.decode() if isinstance(value, bytes) else value)
              for name, value in (raw or {}).items()}
    if "task" not in fields or "status" not in fields:
        return None  # expired between two writes, or never created (only an attempt counter)
    record = {"id": result_id, "task": fields["task"], "backend": fields.get("backend", "default"),
              "queue": fields.get("queue", ""), "status": fields["status"],
              "priority": int(fields.get("priority") or 0), "takes_context": fields.get("takes_context") == "true"}
    for name in _TIMES:
        value = fields.get(name)
        record[name] = datetime.fromisoformat(value) if value else None
    for name in _JSON:
        value = fields.get(name)
        record[name] = json.loads(value) if value else None
    record["retried_as"] = fields.get("retried_as")
    record["cancelled"] = "cancelled" in fields
    record["args"] = record["args"] or []
    record["kwargs"] = record["kwargs"] or {}
    record["worker_ids"] = [fields[f"worker.{n}"] for n in range(1, int(fields.get("attempts") or 0) + 1)
                            if f"worker.{n}" in fields]
    record["errors"] = [json.loads(fields[f"error.{n}"]) for n in range(1, int(fields.get("errors") or 0) + 1)
                        if f"error.{n}" in fields]
    return record
