"""Defaults for ``settings.STREAMS``. Each key may be overridden there; ``streams_app.conf`` merges them."""

REDIS_ALIAS = "default"
"""The django-redis cache alias whose connection Shoal uses (``get_redis_connection(alias)``)."""

BATCH_SIZE = 500
"""The most entries one XREADGROUP / XAUTOCLAIM asks for. Reads are also capped by free handler
slots (two chunks per thread), so slow handlers get small reads: a large value costs nothing there."""

BLOCK_MS = 2000
"""How long an idle XREADGROUP blocks waiting for new entries. Must be below the Redis socket timeout."""

THREADS = 4
"""Handler threads per worker process (``runconsumer --threads``)."""

PENDING_TIMEOUT_MS = 30_000
"""An entry unacknowledged for this long is taken to be abandoned and may be claimed by a live consumer."""

CLAIM_INTERVAL_MS = 10_000
"""How often a consumer looks for abandoned entries (XAUTOCLAIM) and for its own failed ones."""

SHUTDOWN_TIMEOUT = 30.0
"""Seconds in-flight handlers get to finish after SIGTERM/SIGINT before the worker exits anyway."""

CONSUMER_TTL = 15.0
"""Seconds a consumer process's liveness deadline lasts; it is renewed every third of it. When it
lapses the process is known dead and its pending entries are taken over at once, without waiting
for PENDING_TIMEOUT_MS (streams_app/consuming/liveness.py)."""

MAX_PAYLOAD_BYTES = 1024 * 1024
"""The largest JSON payload ``publish`` accepts, in bytes of UTF-8. Redis holds streams in memory."""

RECONNECT_BACKOFF_MAX = 5.0
"""Ceiling, in seconds, of the exponential back-off between attempts to reach an unreachable Redis."""

RETRY_BACKOFF = 1.0
"""Seconds before the first retry of a failed entry; each further delivery doubles it
(``@consumer(retry_backoff=...)`` overrides it per consumer)."""

RETRY_BACKOFF_MAX = 300.0
"""Ceiling, in seconds, of the retry back-off. Takeover of an abandoned entry waits for the larger of
this back-off and PENDING_TIMEOUT_MS, so a message that keeps killing its worker is not retried in a hot loop."""

ERROR_TTL = 7 * 24 * 3600
"""Seconds the last error of a pending entry is kept (``{stream}:error:<group>:<id>``), so that the
dead-letter entry can say why even when the reclaim daemon moves it."""

IDEMPOTENCY_TTL = 7 * 24 * 3600
"""Seconds a processed key is remembered: the Redis guard's TTL, and the age after which the
reclaim daemon deletes ProcessedMessage rows."""

RECLAIM_INTERVAL = 10.0
"""Seconds between two passes of the reclaim daemon (``runreclaimer --interval``)."""

DEAD_CONSUMER_IDLE = 3600.0
"""Seconds a consumer with no pending entries may stay idle before the reclaim daemon removes it."""

SNAPSHOT_INTERVAL = 60.0
"""Seconds between two rows of GroupSnapshot (lag, pending, consumers, dead letters) per group."""

SNAPSHOT_RETENTION = 7 * 24 * 3600
"""Seconds GroupSnapshot rows are kept for the admin charts before the reclaim daemon prunes them."""

BROADCAST_CHANNEL = "shoal:broadcast"
"""The Redis pub/sub channel of ``streams_app.broadcast``. Deployments sharing one Redis need one each."""

# -- the runconsumer supervisor (--workers / --min-workers) -------------------------------------

TARGET_LAG = 100
"""Autoscaling aims at this backlog (XINFO GROUPS ``lag``, summed over the selected groups): above
twice it up to 2 workers are added, below half of it one is removed (``runconsumer --target-lag``)."""

SCALE_INTERVAL = 30.0
"""Seconds between two autoscaling decisions (and lag readings for the metrics) (``--scale-interval``)."""

HEARTBEAT_INTERVAL = 10.0
"""Seconds between two heartbeats of a worker process to its master (``--heartbeat-interval``)."""

HEARTBEAT_TIMEOUT = 60.0
"""A worker whose handlers made no progress for this long while busy, or whose main loop stopped,
is killed and replaced (``--heartbeat-timeout``). Keep it above your longest handler run."""

RESTART_DELAY = 1.0
"""Seconds before a crashed worker is replaced; doubled for each further crash in CRASH_WINDOW, up to 30 s."""

CRASH_LIMIT = 10
"""This many worker crashes within CRASH_WINDOW make the master give up and exit non-zero, so systemd
or Kubernetes sees that something is wrong."""

CRASH_WINDOW = 600.0
"""The window, in seconds, over which worker crashes are counted (see CRASH_LIMIT and RESTART_DELAY)."""

DEFAULTS = {
    "REDIS_ALIAS": REDIS_ALIAS,
    "BATCH_SIZE": BATCH_SIZE,
    "BLOCK_MS": BLOCK_MS,
    "THREADS": THREADS,
    "PENDING_TIMEOUT_MS": PENDING_TIMEOUT_MS,
    "CLAIM_INTERVAL_MS": CLAIM_INTERVAL_MS,
    "SHUTDOWN_TIMEOUT": SHUTDOWN_TIMEOUT,
    "MAX_PAYLOAD_BYTES": MAX_PAYLOAD_BYTES,
    "CONSUMER_TTL": CONSUMER_TTL,
    "RECONNECT_BACKOFF_MAX": RECONNECT_BACKOFF_MAX,
    "RETRY_BACKOFF": RETRY_BACKOFF,
    "RETRY_BACKOFF_MAX": RETRY_BACKOFF_MAX,
    "ERROR_TTL": ERROR_TTL,
    "IDEMPOTENCY_TTL": IDEMPOTENCY_TTL,
    "RECLAIM_INTERVAL": RECLAIM_INTERVAL,
    "DEAD_CONSUMER_IDLE": DEAD_CONSUMER_IDLE,
    "SNAPSHOT_INTERVAL": SNAPSHOT_INTERVAL,
    "SNAPSHOT_RETENTION": SNAPSHOT_RETENTION,
    "BROADCAST_CHANNEL": BROADCAST_CHANNEL,

    "TARGET_LAG": TARGET_LAG,
    "SCALE_INTERVAL": SCALE_INTERVAL,
    "HEARTBEAT_INTERVAL": HEARTBEAT_INTERVAL,
    "HEARTBEAT_TIMEOUT": HEARTBEAT_TIMEOUT,
    "RESTART_DELAY": RESTART_DELAY,
    "CRASH_LIMIT": CRASH_LIMIT,
    "CRASH_WINDOW": CRASH_WINDOW,
}
