from django.db import models


class Effect(models.Model):
    """A handler's own database write; counted to prove effects happen exactly once."""

    name = models.CharField(max_length=100)
    entry_id = models.CharField(max_length=64)


class Tag(models.Model):
    """A row several messages insert "if missing" (the unique name): the db guard's savepoint rule."""

    name = models.CharField(max_length=100, unique=True)


class Order(models.Model):
    """A web request's write that publishes ``order.created`` through the outbox (tests/streams_app/outbox)."""

    name = models.CharField(max_length=100, unique=True)
