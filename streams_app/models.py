"""Database records of streams_app: idempotency guards and the snapshots behind the admin charts."""
from django.db import models


class ProcessedMessage(models.Model):
    """A message key a group has handled, written in the handler's own transaction (idempotent="db")."""

    stream = models.CharField(max_length=200)
    group = models.CharField(max_length=200)
    key = models.CharField(max_length=255, help_text="The message's key field, or its entry id.")
    entry_id = models.CharField(max_length=64)
    processed_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["stream", "group", "key"], name="streams_processed_once"),
        ]

    def __str__(self):
        return f"{self.stream}/{self.group}: {self.key}"


class GroupSnapshot(models.Model):
    """Lag, pending entries, consumers and dead letters of one group at one time (reclaim daemon)."""

    stream = models.CharField(max_length=200)
    group = models.CharField(max_length=200)
    taken_at = models.DateTimeField(db_index=True)
    lag = models.BigIntegerField(null=True, help_text="Entries not yet delivered to the group; null when Redis cannot tell.")
    pending = models.BigIntegerField()
    consumers = models.IntegerField()
    dead_letters = models.BigIntegerField(help_text="This group's letters in the stream's dead-letter stream.")
    entries_read = models.BigIntegerField(
        null=True, help_text="Entries delivered to the group so far (XINFO GROUPS); the chart's throughput is its rate."
    )

    class Meta:
        indexes = [models.Index(fields=["stream", "group", "taken_at"], name="streams_snapshot_series")]
        ordering = ["-taken_at"]

    def __str__(self):
        return f"{self.stream}/{self.group} at {self.taken_at:%Y-%m-%d %H:%M:%S}"


# -- mirrors of Redis state for the admin (streams_app/admin/mirror.py keeps them current) -----------------
# Redis stays the source of truth: these rows are a searchable, filterable copy, refreshed by the
# reclaim daemon each pass and by the admin when a page opens. Each row says when it was copied.


class Stream(models.Model):
    name = models.CharField(max_length=200, unique=True)
    length = models.BigIntegerField(default=0)
    groups = models.IntegerField(default=0)
    dead_letters = models.BigIntegerField(default=0, help_text="Length of the stream's dead-letter stream.")
    last_id = models.CharField(max_length=64, blank=True)
    scheduled = models.BigIntegerField(default=0, help_text="Deferred messages waiting for their time in the "
                                                           "stream's scheduled set ({stream}:scheduled).")
    dlq_cursor = models.CharField(
        max_length=64, default="0-0", help_text="Highest dead-letter id copied into DeadLetter: the next sync reads past it."
    )
    exists = models.BooleanField(default=True, help_text="False once the stream key is gone from Redis.")
    problem = models.CharField(
        max_length=300, blank=True, help_text="Why the stream could not be read, e.g. its key holds another type."
    )
    synced_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]
        default_permissions = ("view",)

    def __str__(self):
        return self.name


class ConsumerGroup(models.Model):
    stream = models.ForeignKey(Stream, on_delete=models.CASCADE, related_name="consumer_groups")
    name = models.CharField(max_length=200)
    lag = models.BigIntegerField(null=True, help_text="Entries not yet delivered to the group; estimated when Redis cannot tell.")
    lag_estimated = models.BooleanField(
        default=False, help_text="Redis reported no lag (entries deleted or trimmed): lag counts the entries after the "
                                 "last delivered id instead."
    )
    pending = models.BigIntegerField(default=0)
    stale_pending = models.IntegerField(
        default=0, help_text="Pending entries idle longer than the pending timeout (counted up to STALE_PENDING_CAP)."
    )
    consumers = models.IntegerField(default=0)
    live_consumers = models.IntegerField(
        null=True, help_text="Consumers of the group whose process renews its liveness deadline (a killed one does not)."
    )
    dead_letters = models.BigIntegerField(
        default=0, help_text="This group's letters still in the stream's dead-letter stream (as far as copied)."
    )
    last_delivered_id = models.CharField(max_length=64, blank=True)
    entries_read = models.BigIntegerField(null=True)
    handler = models.CharField(max_length=300, blank=True, help_text="Empty when no @consumer of this project reads the group.")
    max_deliveries = models.IntegerField(null=True)
    synced_at = models.DateTimeField()

    class Meta:
        ordering = ["stream__name", "name"]
        default_permissions = ("view",)
        constraints = [models.UniqueConstraint(fields=["stream", "name"], name="streams_group_unique")]
        permissions = [
            ("retry_pending", "Can make pending entries due for a retry at once"),
            ("claim_pending", "Can claim pending entries to a consumer"),
            ("ack_pending", "Can acknowledge pending entries without processing them"),
            ("deadletter_pending", "Can move pending entries to the dead letters"),
        ]

    def __str__(self):
        return f"{self.stream.name}:{self.name}"


class DeadLetter(models.Model):
    stream = models.CharField(max_length=200, db_index=True, help_text="The origin stream.")
    entry_id = models.CharField(max_length=64, help_text="Id in the dead-letter stream {stream}:dlq.")
    entry_sort = models.CharField(
        max_length=41, default="", db_index=True, help_text="entry_id as zero-padded ms-seq: sorts as Redis orders ids."
    )
    origin_id = models.CharField(max_length=64, blank=True)
    group = models.CharField(max_length=200, db_index=True)
    consumer = models.CharField(max_length=300, blank=True)
    deliveries = models.IntegerField(null=True)
    error = models.TextField(blank=True)
    error_type = models.CharField(max_length=200, blank=True, db_index=True)
    traceback = models.TextField(blank=True)
    failed_at = models.DateTimeField(null=True, db_index=True)
    payload = models.TextField(blank=True, help_text="The payload field as stored (JSON text).")
    fields = models.JSONField(default=dict, help_text="Every original field of the entry.")
    synced_at = models.DateTimeField()

    class Meta:
        ordering = ["-failed_at", "-id"]
        default_permissions = ("view",)
        constraints = [models.UniqueConstraint(fields=["stream", "entry_id"], name="streams_deadletter_unique")]
        permissions = [
            ("replay_deadletter", "Can replay dead letters to their group"),
            ("delete_deadletter", "Can delete dead letters"),
        ]

    def __str__(self):
        return f"{self.stream} {self.entry_id}"


class ReplayJob(models.Model):
    """Replay every dead letter of one group, in the background (streams_app/deadletters/jobs.py).

    Queued from the admin; the reclaim daemon runs it (one job per pass), reading the dead-letter
    stream in Redis batch by batch, and records its progress here for the admin to show.
    """

    QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"

    stream = models.CharField(max_length=200)
    group = models.CharField(max_length=200)
    requested_by = models.CharField(max_length=150, blank=True)
    state = models.CharField(max_length=10, default=QUEUED, db_index=True,
                             choices=[(s, s) for s in (QUEUED, RUNNING, DONE, FAILED)])
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True)
    heartbeat_at = models.DateTimeField(null=True, help_text="Renewed with each batch; a stale one is taken over.")
    finished_at = models.DateTimeField(null=True)
    scanned = models.BigIntegerField(default=0, help_text="Dead letters of the stream looked at so far.")
    total = models.BigIntegerField(default=0, help_text="Dead letters in the stream when the run started.")
    replayed = models.BigIntegerField(default=0)
    skipped = models.BigIntegerField(default=0, help_text="Gone meanwhile (replayed or deleted by someone else), or too wide.")
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        default_permissions = ("view",)

    def __str__(self):
        return f"replay of {self.stream}:{self.group} dead letters ({self.state})"


class TaskResult(models.Model):
    """No table: the control room's Tasks page (streams_app/admin/tasks.py) reads task results from Redis
    (streams_app.tasks.results). The model gives that page its place in the admin and its permissions."""

    class Meta:
        managed = False
        verbose_name_plural = "tasks"  # the page lists results by queue: "Tasks" in the admin's index
        default_permissions = ("view",)
        permissions = [("retry_taskresult", "Can retry a failed task (enqueued again as a new result)"),
                       ("cancel_taskresult", "Can cancel a task that has not started")]

    def __str__(self):
        return f"task result {self.pk}"


class PeriodicSchedule(models.Model):
    """No table: the control room's Schedules page (streams_app/admin/schedules.py) shows the periodic tasks of
    TASKS (streams_app.tasks.periodic) and their last runs from Redis. The model carries its permissions."""

    class Meta:
        managed = False
        verbose_name = "schedule"
        verbose_name_plural = "schedules"  # the periodic tasks: "Schedules" in the admin's index
        default_permissions = ("view",)
        permissions = [("run_periodicschedule", "Can run a periodic task now (one extra run)")]

    def __str__(self):
        return f"schedule {self.pk}"


class MirrorState(models.Model):
    """When a mirror was last synced, and the error if the last attempt failed: pages show both."""

    name = models.CharField(max_length=50, unique=True)
    synced_at = models.DateTimeField(null=True)
    attempted_at = models.DateTimeField(null=True)
    error = models.TextField(blank=True)

    class Meta:
        default_permissions = ()

    def __str__(self):
        return self.name


from streams_app.outbox.models import OutboxMessage  # noqa: E402,F401  (the model lives with the outbox code)
