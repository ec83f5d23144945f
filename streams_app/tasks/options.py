"""The OPTIONS of a StreamsBackend in TASKS, with their defaults (docs/tasks.md "Settings")."""
import math

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
    # Attempts in all of a task whose attempt raises (a task's own @task(max_attempts=) wins): 1, Django's
    # rule, is FAILED at once. None: MAX_RETRIES + 1. A retry waits as a deferred message (docs/tasks.md "Retries").
    "MAX_ATTEMPTS": None,
    # Seconds before a retry, or a callable from the attempt number to seconds (a task's own backoff= wins).
    # None: streams_app.tasks.exponential(): 1, 2, 4 ... seconds with full jitter, at most 300.
    "BACKOFF": None,
    # Seconds one attempt may run (a task's own @task(timeout=) wins); past it the attempt ends with TaskTimeout
    # and a sync task's worker process is replaced (docs/tasks.md "Time limits"). None: no limit.
    "TIMEOUT": None,
    # Deprecated (system check streams_app.W060): MAX_ATTEMPTS = MAX_RETRIES + 1 means the same.
    "MAX_RETRIES": 0,
    # The queues' consumers' idempotency guard: None, "redis" or "db" (docs/tasks.md "At least once").
    # "db" runs each task in a transaction with a ProcessedMessage row keyed by the result id, so a
    # task whose effects are writes to that database has them once, however often it is delivered.
    "IDEMPOTENT": None,
    # Periodic tasks (Celery's beat): {name: {"task": path, "cron": "..." or "every": seconds, ...}}, enqueued by
    # every runconsumer that runs their queue, each tick once (docs/tasks.md "Periodic tasks"; checks E064-E068).
    "PERIODIC": None,
}


def merged(options):
    config = {**DEFAULTS, **(options or {})}
    if config["MAX_ATTEMPTS"] is None:
        retries = config["MAX_RETRIES"]
        config["MAX_ATTEMPTS"] = retries + 1 if isinstance(retries, int) and retries >= 0 else 1
    return config


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
    attempts = options.get("MAX_ATTEMPTS")
    if attempts is not None:
        problem = attempts_problem(attempts)
        if problem:
            found.append(problem.replace("max_attempts", "MAX_ATTEMPTS", 1))
        elif "MAX_RETRIES" in options:
            found.append("give MAX_ATTEMPTS or MAX_RETRIES, not both (MAX_ATTEMPTS = MAX_RETRIES + 1)")
    if options.get("BACKOFF") is not None:
        problem = backoff_problem(options["BACKOFF"])
        if problem:
            found.append(problem.replace("backoff", "BACKOFF", 1))
    if options.get("TIMEOUT") is not None:
        problem = timeout_problem(options["TIMEOUT"])
        if problem:
            found.append(problem.replace("timeout", "TIMEOUT", 1))
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


def attempts_problem(value):
    """What is wrong with ``max_attempts``/MAX_ATTEMPTS ``value``, or None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"max_attempts is the number of attempts in all, 1 or more (1: never retried), not {value!r}"
    return None


def backoff_problem(value):
    """What is wrong with ``backoff``/BACKOFF ``value``, or None."""
    if callable(value) or seconds(value):
        return None
    return (f"backoff must be seconds (a number, 0 or more) or a callable from the attempt number to seconds, "
            f"not {value!r}")


def timeout_problem(value):
    """What is wrong with ``timeout``/TIMEOUT ``value``, or None."""
    if seconds(value) and value > 0:
        return None
    return f"timeout is the seconds one attempt may run, more than 0 (None: no limit), not {value!r}"


def seconds(value):
    """Whether ``value`` is a number of seconds: finite, 0 or more."""
    try:
        return (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
                and value >= 0)
    except OverflowError:  # an int too large for a float (10 ** 400)
        return False
