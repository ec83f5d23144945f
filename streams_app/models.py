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
    dead_letters = models.BigIntegerField(help_text="Length of the stream's dead-letter stream.")

    class Meta:
        indexes = [models.Index(fields=["stream", "group", "taken_at"], name="streams_snapshot_series")]
        ordering = ["-taken_at"]

    def __str__(self):
        return f"{self.stream}/{self.group} at {self.taken_at:%Y-%m-%d %H:%M:%S}"
