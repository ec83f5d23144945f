"""The reclaim daemon: one pass (``tick``) per interval over every registered group.

A pass: dead-letters pending entries at or over their group's max_deliveries (left by workers
that died mid-handler, over and over), removes consumers idle with nothing pending, trims
acknowledged entries of streams with ``retention="acked"``, moves due deferred messages onto their
streams (a backstop: the consumers move them first), and records snapshots (GroupSnapshot rows for
the admin charts, Prometheus gauges). Several daemons may run at once: each step is safe to repeat
or race (the dead-letter move checks the PEL inside its script; the consumer clean-up is one script;
trimming only ever removes entries every group has acknowledged; a deferred message is moved by one
script that removes it from its scheduled set).
"""
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, UTC

import redis
from django.db import DatabaseError

from streams_app.redis import keys, scripts
from streams_app.publishing import scheduled

from streams_app.deadletters import store as deadletters

from streams_app.consuming import liveness, runs

from streams_app.metrics import consumer as metrics
from streams_app.conf import get_settings
from streams_app.redis.connection import TRANSIENT_ERRORS, get_connection
from shoal_common.redis_errors import is_missing, is_no_permission, is_oom, is_wrongtype
from shoal_common.text import to_text
from streams_app.consuming import refusals
from streams_app.redis.entry_ids import id_key, next_id
from streams_app.registry import registered
from streams_app.redis.lag import backlog

# Its name from before the module moved to streams_app.operations (issue 49): hosts' LOGGING names it.
logger = logging.getLogger("streams_app.reclaim")

AUDIT_PAGE = 1000


def _str(value):
    return to_text(value, errors="backslashreplace")


_id_key = id_key


def _absent(exc):
    """The stream or group does not exist (yet): its consumers create it when they start."""
    return is_missing(exc)


@dataclass
class PassReport:
    dead_lettered: dict = field(default_factory=dict)  # "stream:group" -> entries moved
    consumers_removed: dict = field(default_factory=dict)  # "stream:group" -> names
    trimmed: dict = field(default_factory=dict)  # stream -> entries trimmed
    scheduled_moved: dict = field(default_factory=dict)  # stream -> due deferred messages moved onto it
    snapshots: int = 0
    errors: list = field(default_factory=list)
    unreachable: bool = False  # some step failed because Redis did not answer


class Reclaimer:
    def __init__(self, specs=None, *, conn=None, config=None, clock=time.time):
        self.specs = list(specs) if specs is not None else registered()
        self.follows = specs is None  # every registered group: re-expanded each pass (a repartition's partitions)
        self._conn = conn
        self.config = config or dict(get_settings())
        self.clock = clock  # wall clock: snapshots carry it
        self.stop = threading.Event()
        self.passes = 0
        self.last_report = None
        self._reported = set()  # problems already logged: a key of the wrong type is logged once, not every pass
        self._said_forbidden = False  # the Redis user may not run sorted-set commands (deferred messages)
        self.down_since = None  # monotonic time of the first failed pass of an outage

    @property
    def conn(self):
        # Looked up when used: the first lookup asks Redis whether it is a cluster, and a daemon
        # started while Redis is down must get to its first pass (which reports the outage).
        return self._conn if self._conn is not None else get_connection()

    # -- the loop ---------------------------------------------------------------------------

    def run(self, interval=None, once=False):
        interval = self.config["RECLAIM_INTERVAL"] if interval is None else interval
        while True:
            self.last_report = self.tick()
            if once or self.stop.wait(interval):
                return

    def tick(self, now=None):
        """One pass over every group. A group whose Redis calls fail is skipped until the next pass."""
        now = self.clock() if now is None else now
        report = PassReport()
        if self.follows:
            self.specs = registered()
        for spec in self.specs:
            try:
                self.audit(spec, report)
                self.remove_idle_consumers(spec, report)
            except TRANSIENT_ERRORS as exc:
                self.unreachable(report, f"checking {spec.name}", exc)
            except redis.ResponseError as exc:
                if is_oom(exc):
                    report.errors.append(f"{spec.name}: {exc}")
                    refusals.refused("reclaim", exc)
                elif not _absent(exc):
                    self._skip(spec.name, spec.stream, exc, report)
            except UnicodeDecodeError as exc:
                # Redis holds a name that is not UTF-8 where text was expected: this group waits, the
                # daemon (and the outbox relay thread in it) goes on with the others.
                self._skip(spec.name, spec.stream, exc, report)
        for stream in sorted({s.stream for s in self.specs if s.retention == "acked"}):
            try:
                self.trim(stream, report)
            except TRANSIENT_ERRORS as exc:
                self.unreachable(report, f"trimming {stream}", exc)
            except redis.ResponseError as exc:
                if not _absent(exc):
                    self._skip(stream, stream, exc, report)
        for stream in sorted({s.stream for s in self.specs}):
            try:
                self.move_scheduled(stream, report)
            except TRANSIENT_ERRORS as exc:
                self.unreachable(report, f"moving due deferred messages of {stream}", exc)
            except redis.ResponseError as exc:
                if is_oom(exc):
                    report.errors.append(f"{stream}: {exc}")
                    refusals.refused("scheduled", exc)
                elif is_wrongtype(exc):
                    self._not_moved(stream, scheduled.wrong_types(self.conn, stream), report)
                elif is_no_permission(exc):
                    # Degraded, not failed: deferred publishes are refused alike, so none can be waiting.
                    if not self._said_forbidden:
                        self._said_forbidden = True
                        logger.warning("Reclaimer: deferred messages are not moved: %s", scheduled.ACL_HINT)
                else:
                    self._skip(stream, stream, exc, report)
        self.sync_mirrors(report)  # first: the snapshots count each group's dead letters in the fresh copy
        try:
            self.snapshot(now, report)
        except TRANSIENT_ERRORS as exc:
            self.unreachable(report, "taking snapshots", exc)
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            report.errors.append(f"snapshots: {exc}")
            refusals.refused("snapshot", exc)  # the gauges were set; the row waits for room in Redis
        except DatabaseError as exc:
            report.errors.append(f"snapshots: {exc}")
            logger.warning("Reclaimer: could not store snapshots (%s); dead-lettering and trimming go on", exc)
        self.run_replay_job(report)
        self._reported &= set(report.errors)  # a problem that went away is logged again if it comes back
        if not report.unreachable and self.down_since is not None:
            logger.warning("Reclaimer: Redis reachable again after %.0fs; passes go on", time.monotonic() - self.down_since)
            self.down_since = None
        if not any("maxmemory" in error for error in report.errors):
            refusals.accepted()
        self.passes += 1
        return report

    def unreachable(self, report, what, exc):
        """Record a step that Redis did not answer; log an outage once, not once per step and pass."""
        report.errors.append(f"{what}: {exc}")
        report.unreachable = True
        if self.down_since is None:
            self.down_since = time.monotonic()
            logger.warning("Reclaimer: Redis unreachable while %s (%s); retrying every pass, quietly until it is "
                           "back", what, exc)

    def _skip(self, name, stream, exc, report):
        """A group (or stream) Redis refuses, e.g. its key holds a string: skipped, logged once, reported."""
        if is_wrongtype(exc):
            # The stream or its dead-letter key: name the one that is not a stream, not the other.
            kinds = {key: keys.key_type(self.conn, key) for key in (stream, keys.dead_letter_key(stream))}
            wrong = [f"Redis key {key!r} holds a {kind}" for key, kind in kinds.items() if kind not in ("stream", "none")]
            problem = (f"{name}: {' and '.join(wrong or [f'Redis key {stream!r} holds a {kinds[stream]}'])}, not a "
                       "stream; skipped (Shoal leaves the key as it is)")
        else:
            problem = f"{name}: {type(exc).__name__}: {exc}; skipped until the next pass"
        report.errors.append(problem)
        if problem not in self._reported:
            self._reported.add(problem)
            logger.warning("Reclaimer: %s", problem)

    # -- the steps ----------------------------------------------------------------------------

    def audit(self, spec, report):
        """Dead-letter entries of ``spec``'s group at or over max_deliveries and idle past the pending timeout.

        Idle only: an entry on its last delivery that a live worker is handling right now is left
        alone (the worker dead-letters it itself if it fails).
        """
        over = []
        cursor = "-"
        while True:
            rows = self.conn.xpending_range(spec.stream, spec.group, min=cursor, max="+", count=AUDIT_PAGE,
                                            idle=self.config["PENDING_TIMEOUT_MS"])
            over += [(_str(r["consumer"]), _str(r["message_id"])) for r in rows
                     if r["times_delivered"] >= spec.max_deliveries]
            if len(rows) < AUDIT_PAGE:
                break
            cursor = "(" + _str(rows[-1]["message_id"])
        if over and self.config["COUNT_HANDLER_RUNS"] and not spec.ordered:
            # The run ledger (consuming/runs.py): the count of an entry its holder was not running holds
            # one delivery that ran nothing; what is over is decided with the holders' running records.
            held = {}
            for holder, entry_id in over:
                held.setdefault(holder, []).append(entry_id)
            _, over = runs.take_over(self.conn, spec.stream, spec.group, "", self.config["PENDING_TIMEOUT_MS"],
                                     spec.max_deliveries, held, check=True)
        else:
            over = [entry_id for _, entry_id in over]
        if not over:
            return 0
        result = deadletters.move(self.conn, spec.stream, spec.group, [(i, deadletters.RECORDED_ERROR, "") for i in over])
        if result.refused:
            entry_id, why = result.refused[0]
            report.errors.append(f"{spec.name}: {len(result.refused)} dead-letter moves refused ({why})")
            logger.warning("Reclaimer: Redis refused to move %d entries of %s to %s (first: %s: %s); "
                           "they stay pending and the next pass tries again", len(result.refused), spec.name,
                           keys.dead_letter_key(spec.stream), entry_id, why)
        moved = len(result.moved)
        if moved:
            report.dead_lettered[spec.name] = moved
            metrics.reclaimer_dead_lettered.labels(spec.stream, spec.group).inc(moved)
            logger.warning("Reclaimer: moved %d entries of %s over %d deliveries to %s",
                           moved, spec.name, spec.max_deliveries, keys.dead_letter_key(spec.stream))
        return moved

    def remove_idle_consumers(self, spec, report):
        """XGROUP DELCONSUMER for consumers with nothing pending, idle past DEAD_CONSUMER_IDLE."""
        min_idle = int(self.config["DEAD_CONSUMER_IDLE"] * 1000)
        names = scripts.run(self.conn, "remove_idle_consumers", [spec.stream],
                            [spec.group, min_idle, keys.running_key(spec.stream, spec.group, "")])
        removed = [_str(n) for n in names]  # for the report and the log; Redis is given the bytes it gave
        if removed:
            liveness.forget(self.conn, [spec.stream], None, names=names)
            report.consumers_removed[spec.name] = removed
            logger.info("Reclaimer: removed %d idle consumers with nothing pending from %s: %s",
                        len(removed), spec.name, ", ".join(removed))
        lapsed = liveness.prune(self.conn, spec.stream, min_idle)
        if lapsed:
            logger.info("Reclaimer: forgot %d consumers of %s whose liveness lapsed over %ds ago: %s",
                        len(lapsed), spec.stream, min_idle // 1000, ", ".join(lapsed))
        return removed

    def safe_trim_id(self, stream):
        """The lowest id some group still needs (pending, or not yet delivered), or None: trim below it.

        XINFO GROUPS gives each group's pending count and last delivered id at one instant. With
        nothing pending, every entry up to the last delivered id is acknowledged, for good. With
        entries pending, the lowest of them (XPENDING, read after) bounds the trim: anything below
        it is acknowledged, since undelivered entries all lie above the last delivered id.
        """
        groups = self.conn.xinfo_groups(stream)
        if not groups:
            return None  # nobody reads this stream yet: every entry is unread
        existing = {_str(group["name"]) for group in groups}
        missing = sorted(spec.group for spec in registered() if spec.stream == stream and spec.group not in existing)
        if missing:
            # Declared in code but not created yet (a consumer deployed, not started): it will read
            # from its start position, so nothing may be trimmed until it exists.
            logger.info("Reclaimer: not trimming %s: group(s) %s are declared but not created yet", stream, ", ".join(missing))
            return None
        bounds = []
        for group in groups:
            bound = next_id(group["last-delivered-id"])
            if group["pending"]:
                lowest = self.conn.xpending(stream, group["name"]).get("min")
                if lowest is not None:
                    bound = min(bound, _str(lowest), key=_id_key)
            bounds.append(bound)
        return min(bounds, key=_id_key)

    def trim(self, stream, report):
        minid = self.safe_trim_id(stream)
        if minid is None or minid == "0-1":
            return 0
        trimmed = self.conn.xtrim(stream, minid=minid, approximate=False)
        if trimmed:
            report.trimmed[stream] = trimmed
            metrics.reclaimer_trimmed.labels(stream).inc(trimmed)
            logger.info("Reclaimer: trimmed %d acknowledged entries of %s (below %s)", trimmed, stream, minid)
        return trimmed

    def move_scheduled(self, stream, report):
        """Move the due deferred messages of ``stream`` onto it (streams_app/publishing/scheduled.py), as its consumers
        do: the backstop for a stream none of whose consumers runs, so what is due shows as backlog."""
        moved, result = scheduled.move_all_due(self.conn, stream)
        if moved:
            report.scheduled_moved[stream] = moved
            logger.info("Reclaimer: moved %d due deferred messages onto %s", moved, stream)
        if result.refusal:
            refusal = result.refusal
            if refusal.startswith("OOM"):
                refusals.refused("scheduled", refusal)
            self._not_moved(stream, scheduled.wrong_types(self.conn, stream) if refusal.startswith("WRONGTYPE")
                            else refusal, report)
        return moved

    def _not_moved(self, stream, problem, report):
        problem = (f"{stream}: could not move due deferred messages onto it ({problem}); they stay in "
                   f"{keys.scheduled_key(stream)} (Shoal leaves the keys as they are)")
        report.errors.append(problem)
        if problem not in self._reported:
            self._reported.add(problem)
            logger.warning("Reclaimer: %s", problem)

    def sync_mirrors(self, report):
        """Refresh the admin's copies of Redis state (streams_app/admin/mirror.py); failures only cost freshness."""
        from streams_app.admin import mirror

        try:
            state = mirror.sync_all(conn=self.conn)
        except TRANSIENT_ERRORS as exc:
            self.unreachable(report, "syncing the admin mirror", exc)
        except (redis.ResponseError, DatabaseError) as exc:
            report.errors.append(f"mirror: {exc}")
            logger.warning("Reclaimer: could not sync the admin mirror (%s); the admin shows its age", exc)
        except Exception as exc:  # a bug or bad data in the copy must not stop dead-lettering and trimming
            report.errors.append(f"mirror: {type(exc).__name__}: {exc}")
            logger.exception("Reclaimer: the admin mirror sync failed; the admin shows its age")
        else:
            if state.error:
                report.errors.append(f"mirror: {state.error}")

    def run_replay_job(self, report):
        """Run the oldest replay job queued from the admin (streams_app/deadletters/jobs.py), if any."""
        from streams_app.deadletters import jobs

        try:
            jobs.run_next(self.conn)
        except TRANSIENT_ERRORS as exc:
            self.unreachable(report, "replaying dead letters", exc)
        except DatabaseError as exc:
            report.errors.append(f"replay job: {exc}")
            logger.warning("Reclaimer: could not run a replay job (%s); the next pass tries again", exc)

    def snapshot(self, now, report):
        """Set the gauges every pass; store a GroupSnapshot row per group once per SNAPSHOT_INTERVAL.

        With several daemons, a short-lived key per group lets only one of them write each row.
        """
        from streams_app.admin import mirror
        from streams_app.models import GroupSnapshot, ProcessedMessage

        interval_ms = int(self.config["SNAPSHOT_INTERVAL"] * 1000)
        taken_at = datetime.fromtimestamp(now, UTC)
        rows = []
        by_stream = {}
        for spec in self.specs:
            by_stream.setdefault(spec.stream, []).append(spec.group)
        for stream, groups in by_stream.items():
            if _str(self.conn.type(stream)) != "stream":
                continue  # absent, or another type (reported by the audit)
            pipe = self.conn.pipeline(transaction=False)
            pipe.xinfo_groups(stream)
            pipe.xlen(keys.dead_letter_key(stream))
            try:
                infos, _ = pipe.execute()  # XLEN: a dead-letter key of another type skips the stream here
            except redis.ResponseError as exc:
                self._skip(f"snapshots of {stream}", stream, exc, report)
                continue
            by_group = mirror.dead_letters_by_group(stream)  # the DLQ holds every group's letters
            for info in infos:
                name = _str(info["name"])
                if name not in groups:
                    continue
                lag = info.get("lag")
                if lag:  # before Redis 7.4 a promoted replica's lag can stay too high: checked (null stays null)
                    lag, _ = backlog(self.conn, stream, info)
                metrics.group_consumers.labels(stream, name).set(info["consumers"])
                if self.conn.set(keys.snapshot_lock_key(stream, name), "1", nx=True, px=max(1, interval_ms - 500)):
                    rows.append(GroupSnapshot(stream=stream, group=name, taken_at=taken_at, lag=lag,
                                              pending=info["pending"], consumers=info["consumers"], dead_letters=by_group.get(name, 0),
                                              entries_read=info.get("entries-read")))
        if rows:
            GroupSnapshot.objects.bulk_create(rows)
            report.snapshots = len(rows)
            GroupSnapshot.objects.filter(taken_at__lt=taken_at - timedelta(seconds=self.config["SNAPSHOT_RETENTION"])).delete()
            ProcessedMessage.objects.filter(
                processed_at__lt=taken_at - timedelta(seconds=self.config["IDEMPOTENCY_TTL"])
            ).delete()
