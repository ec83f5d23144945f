from django.db import models


class Effect(models.Model):
    """A handler's own database write; counted to prove effects happen exactly once."""

    name = models.CharField(max_length=100)
    entry_id = models.CharField(max_length=64)
