"""OutboxMessage: a message written in the caller's database transaction, published by the relay after the commit."""
from django.db import models


class OutboxMessage(models.Model):
    """One message waiting for (or done with) the relay. ``fields`` are the stream entry's fields,
    encoded and checked when the row was written, so a bad payload fails in the caller's transaction."""

    id = models.BigAutoField(primary_key=True)  # the relay's order: per key, rows go out in id order
    stream = models.CharField(max_length=200)
    key = models.CharField(max_length=255, help_text="The message key: given, or generated at write time. Rows of "
                                                     "one key go out in order; many messages may share it.")
    fields = models.JSONField(help_text="The entry's fields (payload, key, headers, published_at, and "
                                        "shoal:idempotency_id, this row's own id that the consumers' guards "
                                        "deduplicate a relay's re-send by) as XADD sends them.")
    maxlen = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    relayed_at = models.DateTimeField(null=True, blank=True, help_text="When the relay stored it in Redis; "
                                                                       "relayed rows are deleted after OUTBOX_RETENTION.")
    entry_id = models.CharField(max_length=64, blank=True, help_text="The stream entry id the relay got.")
    attempts = models.IntegerField(default=0, help_text="Failed relay attempts (Redis refused the entry).")
    last_error = models.TextField(blank=True, help_text="Why the last relay attempt failed.")
    next_attempt_at = models.DateTimeField(null=True, blank=True, help_text="A failing row waits until then.")

    class Meta:
        ordering = ["id"]
        verbose_name = "outbox message"
        default_permissions = ("view", "delete")  # rows are written by publish(..., outbox=True) only
        permissions = [("retry_outboxmessage", "Can make waiting outbox rows due at the next relay pass")]
        indexes = [
            # The relay's two queries read unrelayed rows only: keep them small however many are relayed.
            models.Index(fields=["id"], condition=models.Q(relayed_at__isnull=True), name="streams_outbox_waiting"),
            models.Index(fields=["stream", "key", "id"], condition=models.Q(relayed_at__isnull=True),
                         name="streams_outbox_key_order"),
            models.Index(fields=["relayed_at"], condition=models.Q(relayed_at__isnull=False),
                         name="streams_outbox_relayed"),
        ]

    def __str__(self):
        return f"{self.stream} {self.key} (#{self.id})"
