"""Prometheus metrics of the consumers, all named ``shoal_*``.

Recorded once per handler chunk, never per message: ``run_chunk`` calls ``chunk_started`` and
``ChunkRecorder.finished``, which cost a few counter increments per chunk whatever its size.

Where consumer metrics are served: on a port of their own, ``runconsumer --metrics-port``. A single
consumer process serves its in-memory values (``start_metrics_server``). A supervisor gives its
workers a private multiprocess directory (never the web tier's: gunicorn's master empties that one
at start, and web and consumers are scraped, scaled and restarted apart) and serves their sum,
dead workers' counters folded into an archive (``poolmetrics``).

Lag, pending and dead letters per group are read from Redis when scraped (``BacklogCollector``), so
they are right whichever process is scraped; the web tier's /metrics includes them.
"""
import bisect
import logging

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from shoal_common.text import to_text
from streams_app.consuming.outcomes import Status
from streams_app.metrics import multiprocess

logger = logging.getLogger("streams_app.metrics")

LABELS = ("stream", "group")
# A partitioned stream's partition is a stream of its own (stream="orders:3"); these say which
# logical stream it belongs to (partition "" for a stream that is not partitioned).
BACKLOG_LABELS = ("stream", "logical_stream", "partition", "group", "estimated")
# The other figures read from Redis at scrape time carry them too: sum by (logical_stream, group).
GROUP_LABELS = ("stream", "logical_stream", "partition", "group")
STREAM_LABELS = ("stream", "logical_stream", "partition")
# Handler time per message, from 100 µs (no-op handlers) to a minute (slow external calls).
DURATION_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

handled = Counter("shoal_messages_handled_total", "Entries whose handler returned (acked).", LABELS)
failed = Counter("shoal_messages_failed_total", "Entries whose handler raised (reason=error) or whose payload "
                 "could not be decoded (reason=poison).", (*LABELS, "reason"))
dead_lettered = Counter("shoal_messages_dead_lettered_total", "Entries moved to the dead-letter stream.", LABELS)
duration = Histogram("shoal_handler_duration_seconds", "Handler time per entry. Fast handlers run in chunks; "
                     "each chunk's entries are counted in the bucket of the chunk's mean.", LABELS,
                     buckets=DURATION_BUCKETS)
in_flight = Gauge("shoal_messages_in_flight", "Entries handed to handler threads and not finished.", LABELS,
                  multiprocess_mode="livesum")

class ChunkRecorder:
    """The labelled children of one (stream, group), resolved once: ``labels()`` takes a lock."""

    __slots__ = ("handled", "failed_error", "failed_poison", "duration", "in_flight")

    def __init__(self, stream, group):
        self.handled = handled.labels(stream, group)
        self.failed_error = failed.labels(stream, group, Status.FAILED.reason)
        self.failed_poison = failed.labels(stream, group, Status.POISON.reason)
        self.duration = duration.labels(stream, group)
        self.in_flight = in_flight.labels(stream, group)

    def finished(self, count, acked, failures, seconds):
        """``count`` entries took ``seconds`` in all; ``acked`` returned; ``failures`` are Outcomes."""
        self.in_flight.dec(count)
        if acked:
            self.handled.inc(acked)
        if failures:
            poison = sum(1 for outcome in failures if outcome.status is Status.POISON)
            if poison:
                self.failed_poison.inc(poison)
            if len(failures) > poison:
                self.failed_error.inc(len(failures) - poison)
        if count:
            observe_many(self.duration, count, seconds)


_recorders = {}


def recorder(stream, group):
    found = _recorders.get((stream, group))
    if found is None:
        found = _recorders.setdefault((stream, group), ChunkRecorder(stream, group))
    return found


def chunk_started(messages):
    """Count a chunk as in flight; return the recorder whose ``finished()`` closes it."""
    first = messages[0]
    chunk = recorder(first.stream, first.group)
    chunk.in_flight.inc(len(messages))
    return chunk


def observe_many(histogram, count, seconds):
    """Observe ``count`` values whose sum is ``seconds``, all in the bucket of their mean.

    Histogram.observe() costs a lock and a bucket scan per value; this costs two increments per
    chunk. ``_sum`` and ``_count`` stay exact; only the spread inside a chunk is lost.
    """
    index = bisect.bisect_left(histogram._upper_bounds, seconds / count)
    histogram._buckets[index].inc(count)
    histogram._sum.inc(seconds)


def record_dead_lettered(stream, group, count=1):
    """For the dead-letter code: ``count`` entries of ``stream``/``group`` went to ``{stream}:dlq``."""
    dead_lettered.labels(stream, group).inc(count)


class BacklogCollector:
    """Lag, pending and dead-letter counts of the registered groups, read from Redis at scrape time."""

    def __init__(self, specs=None, connection=None):
        """``connection``: a callable returning the Redis client to ask (default: the shared one, whose
        30 s socket timeout is for blocking reads; a scrape wants a short one)."""
        self._specs = specs
        self._connection = connection

    def describe(self):
        # Registering must not query Redis: REGISTRY calls describe(), else collect(), at once.
        return [GaugeMetricFamily(name, "") for name in
                ("shoal_group_lag", "shoal_group_lag_estimated", "shoal_group_backlog", "shoal_group_pending",
                 "shoal_dead_letters", "shoal_key_wrong_type",
                 "shoal_backlog_scrape_ok")]

    def collect(self):
        from shoal_common.redis_errors import is_wrongtype
        from streams_app.redis.connection import TRANSIENT_ERRORS, get_connection
        from streams_app.redis.keys import dead_letter_key
        from streams_app.registry import registered
        from streams_app.redis.lag import backlog as group_backlog

        specs = self._specs if self._specs is not None else registered()
        lag = GaugeMetricFamily("shoal_group_lag", "Entries of the stream not yet delivered to the group.",
                                labels=GROUP_LABELS)
        estimated = GaugeMetricFamily("shoal_group_lag_estimated", "1 if shoal_group_lag is an estimate: Redis reported "
                                      "no lag (entries deleted or trimmed), or a lag the entries after the last "
                                      "delivered id showed too high (Redis < 7.4 after a failover), so they were counted.", labels=GROUP_LABELS)
        backlog = GaugeMetricFamily(
            "shoal_group_backlog", "Entries not yet delivered to the group (shoal_group_lag) with the logical "
            "stream and partition of a partitioned stream: sum it by logical_stream. What autoscalers should read.",
            labels=BACKLOG_LABELS)
        pending = GaugeMetricFamily("shoal_group_pending", "Entries delivered to the group and not acknowledged.",
                                    labels=GROUP_LABELS)
        dead = GaugeMetricFamily("shoal_dead_letters", "Entries in the stream's dead-letter stream.", labels=STREAM_LABELS)
        wrong = GaugeMetricFamily(
            "shoal_key_wrong_type", "1 for a key of a registered stream (the stream, or its dead letters {S}:dlq) "
            "that holds another type: its figures (the group gauges, shoal_dead_letters) cannot be read. "
            "Shoal leaves such a key alone; rename or remove it.", labels=(*STREAM_LABELS, "key", "type"))
        up = GaugeMetricFamily("shoal_backlog_scrape_ok", "1 if Redis answered this scrape's backlog queries.")
        streams = sorted({spec.stream for spec in specs})
        wanted = {(spec.stream, spec.group): spec for spec in specs}
        try:
            conn = (self._connection or get_connection)()
            if not streams:
                # An empty pipeline never reaches Redis: with no group registered the scrape said
                # scrape_ok 1 with Redis down or frozen.
                conn.ping()
            pipe = conn.pipeline(transaction=False)
            for stream in streams:
                pipe.xinfo_groups(stream)
                pipe.xlen(dead_letter_key(stream))
            replies = pipe.execute(raise_on_error=False)
        except TRANSIENT_ERRORS as exc:
            logger.warning("Metrics: Redis unreachable for the backlog figures: %s", exc)
            up.add_metric([], 0)
            return [up]
        where = {spec.stream: (spec.logical, "" if spec.partition is None else str(spec.partition)) for spec in specs}
        # Keys of another type: flagged with what they hold, so the missing series has a reason to alert on.
        refused = [key for stream, groups, dlq_length in zip(streams, replies[::2], replies[1::2])
                   for key, reply in ((stream, groups), (dead_letter_key(stream), dlq_length)) if is_wrongtype(reply)]
        kinds = dict(zip(refused, _key_types(conn, refused)))
        for stream in streams:
            for key in (stream, dead_letter_key(stream)):
                if key in kinds:
                    wrong.add_metric([stream, *where[stream], key, kinds[key]], 1)
        for stream, groups, dlq_length in zip(streams, replies[::2], replies[1::2]):
            logical, partition = where[stream]
            if isinstance(dlq_length, int):
                dead.add_metric([stream, logical, partition], dlq_length)
            if isinstance(groups, Exception):
                continue  # no such stream yet, or a key of another type (flagged above)
            for info in groups:
                name = _text(info["name"])
                if (stream, name) not in wanted:
                    continue
                labels = [stream, logical, partition, name]
                pending.add_metric(labels, info["pending"])
                try:
                    # Null lag (entries deleted, stream trimmed) is counted, never reported as zero; a lag a
                    # Redis before 7.4 may overstate (a promoted replica) is checked against a count.
                    value, counted = group_backlog(conn, stream, info)
                except TRANSIENT_ERRORS:
                    continue
                lag.add_metric(labels, value)
                estimated.add_metric(labels, 1 if counted else 0)
                backlog.add_metric([*labels, "true" if counted else "false"], value)
        up.add_metric([], 1)
        return [lag, estimated, backlog, pending, dead, wrong, up]


def _text(value):
    return to_text(value, errors="backslashreplace")


def _key_types(conn, names):
    """TYPE of each key, asked only for the keys that refused a stream command (none, mostly)."""
    from streams_app.redis.connection import TRANSIENT_ERRORS

    if not names:
        return []
    try:
        return [_text(conn.type(name)) for name in names]
    except TRANSIENT_ERRORS:
        return ["unknown"] * len(names)


def start_metrics_server(port, addr="0.0.0.0"):
    """Serve /metrics on ``port`` for consumer processes; returns (server, thread).

    Call it in runconsumer's master (``--metrics-port``). With ``PROMETHEUS_MULTIPROC_DIR`` set,
    the master must also call ``multiprocess.reset(dir)`` before forking workers and
    ``multiprocess.process_dead(pid)`` when it reaps one, as gunicorn.conf.py does for the web tier.
    """
    path = multiprocess.directory()
    registry = multiprocess.multiprocess_registry(path) if path else REGISTRY
    registry.register(BacklogCollector())
    return start_http_server(port, addr=addr, registry=registry)


# Set by the reclaim daemon on each pass. Lag, pending and dead-letter counts are not among them:
# BacklogCollector reads those from Redis at scrape time, so they are never a pass old.
group_consumers = Gauge("shoal_group_consumers", "Consumers registered in the group.", LABELS, multiprocess_mode="mostrecent")
reclaimer_dead_lettered = Counter("shoal_reclaimer_dead_lettered", "Entries the reclaim daemon moved to a dead-letter stream.", LABELS)
reclaimer_trimmed = Counter("shoal_reclaimer_trimmed", "Acknowledged entries the reclaim daemon trimmed.", ("stream",))
redis_writes_refused = Counter(
    "shoal_redis_writes_refused", "Writes Redis refused at maxmemory (OOM) that a consumer skipped or deferred "
    "(what=liveness, last_error, dead_letter, idempotency, group, reclaim, snapshot).", ("what",))
redis_oom = Gauge("shoal_redis_oom", "1 while this process's last write was refused at Redis's maxmemory, else 0.",
                  multiprocess_mode="max")
