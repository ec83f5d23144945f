"""The transactional outbox: ``publish(..., outbox=True)`` writes a row in the caller's transaction;
a relay moves committed rows to Redis.

- ``models``: OutboxMessage, one row per message to publish.
- ``enqueue``: writing rows (the producer's ``outbox=True`` path) and the commit nudge.
- ``relay``: the relay (claim, XADD, mark; the sweeper loop; the SQLite one-at-a-time guard).
- ``cleanup``: deleting relayed rows in bounded batches; the backlog figures.

docs/publishing.md explains the pattern and which process runs the relay.
"""
