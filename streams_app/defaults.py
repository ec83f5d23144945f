"""Every key of ``settings.STREAMS``: its default, kind and meaning, in one table.

``streams_app.conf`` merges ``STREAMS`` over ``DEFAULTS``; the system checks (streams_app/checks.py)
check each key against its kind; docs/settings.md shows the table (``python -m project.settings_docs``
writes it, and a test fails when the docs drift). Add a key here, and only here.
"""

from shoal_common.appsettings import (BOOLEAN, MILLISECONDS_INT, NON_EMPTY_STRING, POSITIVE_INT, POSITIVE_NUMBER, SECONDS_INT, Kind,
                                     Setting, defaults_of)

CACHE_ALIAS = Kind("django-redis cache alias")  # checked against CACHES by streams_app.E004 / E005
CODEC_NAME = Kind("codec name: 'json' or 'orjson'")  # checked by streams_app.E030 (orjson must be installed)
PARTITION_COUNTS = Kind("stream name -> partition count (1 to 1024)")  # streams_app.E031

SETTINGS = (
    Setting("REDIS_ALIAS", "default", CACHE_ALIAS,
            "The django-redis cache alias whose connection Shoal uses (``get_redis_connection(alias)``)."),
    Setting("BATCH_SIZE", 500, POSITIVE_INT,
            "The most entries one XREADGROUP / XAUTOCLAIM asks for. Reads are also capped by free handler "
            "slots (two chunks per thread), so slow handlers get small reads: a large value costs nothing there."),
    Setting("BLOCK_MS", 2000, MILLISECONDS_INT,
            "How long an idle XREADGROUP blocks waiting for new entries. A consumer's reader gets its own socket "
            "timeout, BLOCK_MS plus 5 s, so a read on a dead connection fails soon after its block (docs/consuming.md); "
            "BLOCK_MS may therefore exceed the cache's SOCKET_TIMEOUT, at the cost of a later recovery from a network fault."),
    Setting("THREADS", 4, POSITIVE_INT,
            "Handler threads per worker process (``runconsumer --threads``)."),
    Setting("ASYNC_CONCURRENCY", 100, POSITIVE_INT,
            "The most ``async def`` handlers one worker process awaits at once (``runconsumer --concurrency``). "
            "They share one event loop; sync handlers are bounded by THREADS instead."),
    Setting("PENDING_TIMEOUT_MS", 30_000, MILLISECONDS_INT,
            "An entry unacknowledged for this long is taken to be abandoned and may be claimed by a live consumer."),
    Setting("COUNT_HANDLER_RUNS", True, BOOLEAN,
            "Delivery counts follow handler runs, so a worker's death charges only the entries it was running "
            "and max_deliveries never dead-letters an entry for runs it never had (docs/failures.md). It costs a small "
            "Redis write per read and an HDEL riding with the acks: False keeps Redis's own counts (a death charges "
            "every entry of the worker's reads) and saves that round trip (bench/README.md)."),
    Setting("CLAIM_INTERVAL_MS", 10_000, MILLISECONDS_INT,
            "How often a consumer looks for abandoned entries (XAUTOCLAIM) and for its own failed ones."),
    Setting("SHUTDOWN_TIMEOUT", 30.0, POSITIVE_NUMBER,
            "Seconds in-flight handlers get to finish after SIGTERM/SIGINT before the worker exits anyway."),
    Setting("CONSUMER_TTL", 15.0, POSITIVE_NUMBER,
            "Seconds a consumer process's liveness deadline lasts; it is renewed every third of it. When it "
            "lapses the process is known dead and its pending entries are taken over at once, without waiting "
            "for PENDING_TIMEOUT_MS (streams_app/consuming/liveness.py)."),
    Setting("MAX_PAYLOAD_BYTES", 1024 * 1024, POSITIVE_INT,
            "The largest entry ``publish`` accepts: payload, key and headers together, in bytes of UTF-8. "
            "Redis holds streams in memory."),
    Setting("CODEC", "orjson", CODEC_NAME,
            "The engine that writes and reads payload JSON: ``orjson`` (in requirements.txt; measured faster, "
            "bench/README.md) or ``json`` (the standard library). Both write the same envelope with the same "
            "refusals, so producers and consumers may differ; ``publish(..., codec=...)`` overrides it per call.",
            check_id="E030"),
    Setting("RECONNECT_BACKOFF_MAX", 5.0, POSITIVE_NUMBER,
            "Ceiling, in seconds, of the exponential back-off between attempts to reach an unreachable Redis."),
    Setting("RETRY_BACKOFF", 1.0, POSITIVE_NUMBER,
            "Seconds before the first retry of a failed entry; each further delivery doubles it "
            "(``@consumer(retry_backoff=...)`` overrides it per consumer)."),
    Setting("RETRY_BACKOFF_MAX", 300.0, POSITIVE_NUMBER,
            "Ceiling, in seconds, of the retry back-off. Takeover of an abandoned entry waits for the larger of "
            "this back-off and PENDING_TIMEOUT_MS, so a message that keeps killing its worker is not retried in a hot loop."),
    Setting("ERROR_TTL", 7 * 24 * 3600, SECONDS_INT,
            "Seconds the last error of a pending entry is kept (``{stream}:error:<group>:<id>``), so that the "
            "dead-letter entry can say why even when the reclaim daemon moves it."),
    Setting("IDEMPOTENCY_TTL", 7 * 24 * 3600, SECONDS_INT,
            "Seconds a processed key is remembered: the Redis guard's TTL, and the age after which the "
            "reclaim daemon deletes ProcessedMessage rows."),
    Setting("RECLAIM_INTERVAL", 10.0, POSITIVE_NUMBER,
            "Seconds between two passes of the reclaim daemon (``runreclaimer --interval``)."),
    Setting("DEAD_CONSUMER_IDLE", 3600.0, POSITIVE_NUMBER,
            "Seconds a consumer with no pending entries may stay idle before the reclaim daemon removes it."),
    Setting("SNAPSHOT_INTERVAL", 60.0, POSITIVE_NUMBER,
            "Seconds between two rows of GroupSnapshot (lag, pending, consumers, dead letters) per group."),
    Setting("SNAPSHOT_RETENTION", 7 * 24 * 3600, SECONDS_INT,
            "Seconds GroupSnapshot rows are kept for the admin charts before the reclaim daemon prunes them."),
    Setting("ADMIN_REDIS_TIMEOUT", 2.0, POSITIVE_NUMBER,
            "Seconds an admin page or action waits for Redis (connect and each reply, no retry). After one "
            "failure the page makes no further Redis call and shows the mirror's last copy, so a hung Redis costs "
            "a page about this long, never the pool's SOCKET_TIMEOUT (5 s)."),
    Setting("BROADCAST_CHANNEL", "shoal:broadcast", NON_EMPTY_STRING,
            "The Redis pub/sub channel of ``streams_app.broadcast``. Deployments sharing one Redis need one each.", check_id="E020"),
    # -- the transactional outbox (streams_app/outbox, docs/publishing.md) --------------------
    Setting("OUTBOX_BATCH", 500, POSITIVE_INT,
            "Outbox rows one relay claims, XADDs in one pipeline and marks in one transaction; also the size of "
            "each delete of relayed rows."),
    Setting("OUTBOX_SWEEP_INTERVAL", 2.0, POSITIVE_NUMBER,
            "Seconds a relay waits for a commit's nudge before it sweeps the outbox anyway (rows whose nudge was "
            "lost: a process killed after its commit, Redis away). Keep it below the Redis socket timeout."),
    Setting("OUTBOX_RETENTION", 3600, POSITIVE_INT,
            "Seconds a relayed outbox row is kept (the admin shows it) before the relay deletes it."),

    # -- deferred messages (publish(..., run_after=...): streams_app/publishing/scheduled.py, docs/publishing.md) ----
    Setting("SCHEDULED_POLL_INTERVAL", 1.0, POSITIVE_NUMBER,
            "Seconds between two looks of each consumer process at the scheduled set of each stream it reads "
            "(one script call per Redis node for all of them); a set whose first message falls due sooner is "
            "looked at then. A deferred message published less than this before its time may start up to this late."),
    Setting("SCHEDULED_BATCH", 100, POSITIVE_INT,
            "The most due deferred messages one move script call puts onto a stream (and at most 4 MiB of them); "
            "while more are due, the mover calls again at once."),
    Setting("RUN_AFTER_MAX", 366 * 24 * 3600, SECONDS_INT,
            "The furthest ahead, in seconds, ``publish(..., run_after=...)`` accepts (a datetime or a timedelta); "
            "beyond it the publish is refused with a PublishError, as a likely unit mistake."),

    Setting("PARTITIONS", {}, PARTITION_COUNTS,
            "Partitioned streams: ``{\"orders\": 6}`` spreads the logical stream ``orders`` over 6 streams (one "
            "cluster slot each, spread over the masters). ``publish(..., key=k)`` routes by CRC-32 of the key, "
            "without a key round-robin; ``@consumer(\"orders\", ...)`` reads every partition. Changing the count "
            "here for a stream that has entries is refused (streams_app/partitioning/partitions.py); ``manage.py repartition "
            "STREAM N`` changes it online, and from then on the live count in Redis wins (warning "
            "streams_app.W031 while this names another).", check_id="E031"),
    Setting("LEASE_TTL_MS", 10_000, MILLISECONDS_INT,
            "Ordered mode (``@consumer(..., ordered=True)``): how long a partition's lease lasts on the Redis clock "
            "unless renewed. A consumer killed or paused longer than this loses its partitions; another takes them "
            "over within LEASE_TTL_MS + LEASE_INTERVAL_MS. Keep it above the pauses a live process may have (GC, "
            "VM migration): a pause past it hands the partition on (docs/cluster.md). Below 1000 ms: warning "
            "streams_app.W032 (leases that short lapse in normal operation and entries run twice)."),
    Setting("LEASE_INTERVAL_MS", 2_000, MILLISECONDS_INT,
            "Ordered mode: how often each consumer heartbeats its group's membership, renews its leases and "
            "rebalances (at most ceil(partitions / live consumers) each). At most a third of LEASE_TTL_MS, so "
            "each lease is renewed at least three times (streams_app.E032).", check_id="E032"),
    # -- the runconsumer supervisor (--workers / --min-workers) ------------------------------
    Setting("TARGET_LAG", 100, POSITIVE_INT,
            "Autoscaling aims at this backlog (XINFO GROUPS ``lag``, summed over the selected groups): above "
            "twice it up to 2 workers are added, below half of it one is removed (``runconsumer --target-lag``)."),
    Setting("SCALE_INTERVAL", 30.0, POSITIVE_NUMBER,
            "Seconds between two autoscaling decisions (and lag readings for the metrics) (``--scale-interval``)."),
    Setting("HEARTBEAT_INTERVAL", 10.0, POSITIVE_NUMBER,
            "Seconds between two heartbeats of a worker process to its master (``--heartbeat-interval``)."),
    Setting("HEARTBEAT_TIMEOUT", 60.0, POSITIVE_NUMBER,
            "A worker whose handlers made no progress for this long while busy, or whose main loop stopped, "
            "is killed and replaced (``--heartbeat-timeout``). Keep it above your longest handler run."),
    Setting("RESTART_DELAY", 1.0, POSITIVE_NUMBER,
            "Seconds before a crashed worker is replaced; doubled for each further crash in CRASH_WINDOW, up to 30 s."),
    Setting("CRASH_LIMIT", 10, POSITIVE_INT,
            "This many worker crashes within CRASH_WINDOW make the master give up and exit non-zero, so systemd "
            "or Kubernetes sees that something is wrong."),
    Setting("CRASH_WINDOW", 600.0, POSITIVE_NUMBER,
            "The window, in seconds, over which worker crashes are counted (see CRASH_LIMIT and RESTART_DELAY)."),
)

DEFAULTS = defaults_of(SETTINGS)

