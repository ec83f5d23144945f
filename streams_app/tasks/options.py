"""The OPTIONS of a StreamsBackend in TASKS, with their defaults (docs/tasks.md "Settings")."""

DEFAULTS = {
    # Seconds a result is kept after its last write (get_result raises TaskResultDoesNotExist after).
    "RESULT_TTL": 7 * 24 * 3600,
    # True: enqueue writes the message to the transactional outbox of DATABASE, in the caller's
    # transaction; the relay (runrelay) publishes it after the commit.
    "OUTBOX": False,
    "DATABASE": "default",
    # Deliveries of one task message before it is dead-lettered as "killed or stuck" (crashes,
    # takeovers and retries all count): the consumer's max_deliveries.
    "MAX_DELIVERIES": 5,
    # How many times a task that raised is run again (after STREAMS["RETRY_BACKOFF"]) before its
    # result is FAILED and the message dead-lettered. 0: Django's rule, a raise is FAILED at once.
    "MAX_RETRIES": 0,
    # The queues' consumers' idempotency guard: None, "redis" or "db" (docs/tasks.md "At least once").
    # "db" runs each task in a transaction with a ProcessedMessage row keyed by the result id, so a
    # task whose effects are writes to that database has them once, however often it is delivered.
    "IDEMPOTENT": None,
}


def merged(options):
    return {**DEFAULTS, **(options or {})}


def problems(options):
    """What is wrong with ``options`` (a list of sentences), for the system checks."""
    if not isinstance(options, dict):
        return [f"OPTIONS must be a dict, not {type(options).__name__}"]
    found = [f"unknown option {name!r} (known: {', '.join(DEFAULTS)})" for name in options if name not in DEFAULTS]
    for name in ("RESULT_TTL", "MAX_DELIVERIES"):
        value = options.get(name, DEFAULTS[name])
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            found.append(f"{name} must be a positive whole number, not {value!r}")
    value = options.get("MAX_RETRIES", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        found.append(f"MAX_RETRIES must be a whole number, 0 or more, not {value!r}")
    elif value >= options.get("MAX_DELIVERIES", DEFAULTS["MAX_DELIVERIES"]) if isinstance(
            options.get("MAX_DELIVERIES", 5), int) else False:
        found.append(f"MAX_RETRIES ({value}) must be below MAX_DELIVERIES: each retry is a delivery")
    if options.get("IDEMPOTENT") not in (None, "redis", "db"):
        found.append(f"IDEMPOTENT must be None, 'redis' or 'db', not {options['IDEMPOTENT']!r}")
    if not isinstance(options.get("OUTBOX", False), bool):
        found.append(f"OUTBOX must be True or False, not {options['OUTBOX']!r}")
    if not isinstance(options.get("DATABASE", "default"), str):
        found.append(f"DATABASE must be a database alias, not {options['DATABASE']!r}")
    return found


def valid_queues(params):
    """Whether a TASKS entry's QUEUES is a non-empty list of names (E062 says what is wrong otherwise)."""
    names = params.get("QUEUES", ["default"])
    return isinstance(names, (list, tuple)) and bool(names) and all(isinstance(name, str) for name in names)
