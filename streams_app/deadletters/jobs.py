"""Background replays: every dead letter of a group, run by the reclaim daemon, not in a web request.

A replay of 100,000 letters takes longer than any HTTP request may. The admin queues a ReplayJob;
each reclaim pass runs the oldest queued one (``run_next``) with ``replay(all=True)``, which reads
the dead-letter stream in batches and removes each letter it replays, recording progress after every
batch. A job whose runner died (no heartbeat for STALE_AFTER) is taken over by the next pass:
replaying again is safe, since what was replayed left the dead-letter stream. Its counts go on from
what the dead runner did: the replay script counts each batch in Redis in the same step
(keys.replay_job_key), so even a batch whose runner died before recording it is counted.
"""
import functools
import logging
from datetime import timedelta

import redis
from django.db import DatabaseError
from django.utils import timezone

from streams_app.redis import keys
from streams_app.redis.connection import TRANSIENT_ERRORS
from streams_app.deadletters.replay import replay
from streams_app.exceptions import ReplayError

logger = logging.getLogger("streams_app.reclaim")

STALE_AFTER = timedelta(minutes=2)
COUNTER_TTL = 86_400  # seconds the Redis count of a job outlives its last batch (a takeover comes within minutes)


def queue(stream, group, requested_by=""):
    from streams_app.models import ReplayJob

    return ReplayJob.objects.create(stream=stream, group=group, requested_by=requested_by)


def _claim(now):
    """The oldest job to run now, marked running by this process (one UPDATE: two daemons never share one)."""
    from django.db.models import Q

    from streams_app.models import ReplayJob

    ready = Q(state=ReplayJob.QUEUED) | Q(state=ReplayJob.RUNNING, heartbeat_at__lt=now - STALE_AFTER)
    for job in ReplayJob.objects.filter(ready).order_by("created_at", "id")[:5]:
        taken = ReplayJob.objects.filter(ready, pk=job.pk).update(state=ReplayJob.RUNNING, heartbeat_at=now,
                                                                  started_at=job.started_at or now)
        if taken:
            job.refresh_from_db()
            return job
    return None


def run_next(conn, now=None):
    """Run the oldest queued replay job to its end; None when there is none. Redis errors are raised
    after the job is queued again (the next pass goes on with it)."""
    from streams_app.models import ReplayJob

    job = _claim(now or timezone.now())
    if job is None:
        return None

    counter = keys.replay_job_key(job.stream, job.pk)
    before = None

    def progress(scanned, total):
        # The letters replayed before (by a runner that died) left the dead-letter stream: they count
        # as looked at. The replayed count is the script's own, runners before this one included.
        pipe = conn.pipeline(transaction=False)
        pipe.hget(counter, "replayed")
        pipe.expire(counter, COUNTER_TTL)
        replayed = max(before, int(pipe.execute()[0] or 0))
        ReplayJob.objects.filter(pk=job.pk).update(scanned=before + scanned, total=before + total, replayed=replayed,
                                                   heartbeat_at=timezone.now())

    logger.info("Reclaimer: replaying the dead letters of %s:%s (job %s)", job.stream, job.group, job.pk)
    try:
        # What runners before this one replayed, counted by the script (the row may miss their last batch).
        before = max(job.replayed, int(conn.hget(counter, "replayed") or 0))
        result = replay(job.stream, job.group, all=True, conn=conn, progress=progress, counter=counter,
                        batch_done=functools.partial(audit, job))
    except (ReplayError, redis.ResponseError) as exc:
        ReplayJob.objects.filter(pk=job.pk).update(state=ReplayJob.FAILED, error=str(exc), finished_at=timezone.now())
        _forget(conn, counter)
        return job
    except TRANSIENT_ERRORS as exc:
        ReplayJob.objects.filter(pk=job.pk).update(state=ReplayJob.QUEUED, error=f"interrupted ({exc}); goes on")
        raise
    except DatabaseError:
        raise  # the row itself cannot be written: the daemon says so, and a later pass takes the job over
    except Exception as exc:
        # Whatever one job meets (bad data, a bug) ends that job, never the daemon that also dead-letters,
        # trims and audits: restarted, it would run into the same job again.
        logger.exception("Reclaimer: replay job %s (%s:%s) failed", job.pk, job.stream, job.group)
        ReplayJob.objects.filter(pk=job.pk).update(state=ReplayJob.FAILED, error=f"{type(exc).__name__}: {exc}",
                                                   finished_at=timezone.now())
        _forget(conn, counter)
        return job
    ReplayJob.objects.filter(pk=job.pk).update(
        state=ReplayJob.DONE, finished_at=timezone.now(), error="",
        # Skipped letters are still in the dead-letter stream and were looked at again: this run's are all.
        replayed=before + len(result.replayed), skipped=len(result.skipped))
    _forget(conn, counter)
    job.refresh_from_db()
    logger.info("Reclaimer: replayed %d dead letters of %s:%s (job %s)", job.replayed, job.stream, job.group, job.pk)
    return job


def audit(job, stream, replayed):
    """One LogEntry per replayed letter, by whoever queued the job, as the admin's own replay action
    writes (README, docs/admin.md): a batch's in one INSERT, so 100,000 letters cost 500 inserts,
    not 100,000. Its object is the letter's mirrored row when there is one: that letter's History
    finds it. A job queued by no user (the shell's jobs.queue) or by one deleted since is not in the
    admin's history: the job's own row is its record."""
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.auth import get_user_model
    from django.contrib.contenttypes.models import ContentType

    from streams_app.models import DeadLetter

    user = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: job.requested_by}).first() \
        if job.requested_by else None
    if user is None:
        return
    rows = dict(DeadLetter.objects.filter(stream=stream, entry_id__in=[i for i, _ in replayed])
                .values_list("entry_id", "pk"))
    kind = ContentType.objects.get_for_model(DeadLetter, for_concrete_model=False)
    LogEntry.objects.bulk_create([
        LogEntry(user_id=user.pk, content_type=kind, object_id=str(rows[letter]) if letter in rows else None,
                 object_repr=f"{stream} {letter}"[:200], action_flag=CHANGE,
                 change_message=f"Replayed to group {job.group} of {stream} as entry {new_id} (replay job {job.pk})")
        for letter, new_id in replayed
    ], batch_size=500)


def _forget(conn, counter):
    try:
        conn.delete(counter)
    except TRANSIENT_ERRORS:
        pass  # it expires (COUNTER_TTL)
