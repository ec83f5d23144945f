"""Periodic tasks (Celery's beat): ``TASKS[alias]["OPTIONS"]["PERIODIC"]``, enqueued by every ``runconsumer``
that runs their queue, each tick exactly once (docs/tasks.md "Periodic tasks").

``schedule``: when the ticks fall (every N seconds, cron in a time zone); ``entries``: the settings read,
and what is wrong with them (the system checks); ``scheduler``: the claim that enqueues each tick once.
"""
