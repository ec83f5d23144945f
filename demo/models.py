from django.db import models


class Order(models.Model):
    """The demo's model write: saved with its ``orders`` event in one transaction (the outbox)."""

    customer = models.CharField(max_length=50)
    total = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"order {self.pk} ({self.customer}, {self.total})"
