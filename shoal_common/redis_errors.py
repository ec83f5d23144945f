"""What a Redis error reply means, in one place.

Messages are matched with ``in``, not ``startswith``: redis-py prefixes errors raised from a pipeline
("Command # 1 (...) of pipeline caused error: NOGROUP ...").
"""
import redis


def _says(exc, text):
    return isinstance(exc, redis.ResponseError) and text in str(exc)


def is_busygroup(exc):
    """XGROUP CREATE of a group that exists: another process created it first."""
    return _says(exc, "BUSYGROUP")


def is_nogroup(exc):
    """The group (or the stream) vanished, e.g. a Redis without persistence restarted."""
    return _says(exc, "NOGROUP")


def is_wrongtype(exc):
    """A command met a key of another type."""
    return _says(exc, "WRONGTYPE")


def is_no_such_key(exc):
    """XINFO of a stream that does not exist ("ERR no such key")."""
    return isinstance(exc, redis.ResponseError) and "no such key" in str(exc).lower()


def is_missing(exc):
    """The stream or its group does not exist (yet): consumers create both when they start."""
    return is_nogroup(exc) or is_no_such_key(exc)


def is_lost_group(exc):
    """The group vanished under a reader: NOGROUP, or a blocked XREADGROUP whose stream key was deleted
    meanwhile (FLUSHALL, FLUSHDB, DEL), which gets "UNBLOCKED the stream key no longer exists"."""
    return is_nogroup(exc) or _says(exc, "UNBLOCKED the stream key no longer exists")


def is_oom(exc):
    """Redis refused a write at ``maxmemory`` (noeviction). Reads, XACK and XCLAIM still work then.

    By message as well as class: inside a script or a pipeline the error may arrive re-wrapped.
    """
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or _says(exc, "used memory > 'maxmemory'")


def is_no_permission(exc):
    """The Redis user's ACL forbids the command (a least-privilege user; see "Redis ACL" in the docs).
    Inside a script Redis says so in words: "The user executing the script can't run this command"."""
    return (isinstance(exc, redis.exceptions.NoPermissionError) or _says(exc, "NOPERM")
            or _says(exc, "user executing the script can't run"))


# How redis-py words a failure to connect ("Error 111 connecting to ...", "Timeout connecting to
# server"), and a page's call that was never made (shoal_common.page_redis.OneAttempt).
_NOT_SENT = ("connecting to", "not asked again on this page", "no Redis client could be made")


def may_have_run(exc):
    """A connection error or timeout after which Redis may have run the command all the same.

    Once a command is sent, a client that gives up waiting (a hung Redis, a broken connection)
    cannot know whether it ran: a frozen Redis runs what it received when it is continued. Only an
    error in connecting says that nothing was sent. A cluster's refusals (CLUSTERDOWN, MOVED...)
    ran nothing either.
    """
    if not isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return False
    return not any(text in str(exc) for text in _NOT_SENT)


def is_unblocked(exc):
    """A blocked command cut short because its node stopped being a master (``-UNBLOCKED ...``).

    What a blocking XREADGROUP gets during a planned failover (CLUSTER FAILOVER): transient like
    a lost connection, but a plain ResponseError, so it cannot sit in TRANSIENT_ERRORS.
    """
    return _says(exc, "UNBLOCKED")
