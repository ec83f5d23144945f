"""Names of the registry's Redis keys.

Every key of one service embeds the service name as a hash tag, ``discovery:{orders}:instances``,
so on Redis Cluster they share one slot and the Lua scripts that touch them all stay legal.
Only the list of service names (``discovery:services``) lives elsewhere; it is a hint that
readers double-check, never the truth about an instance.
"""
from discovery_app.conf import setting


def _prefix():
    return setting("KEY_PREFIX")


def records_key(service):
    """HASH instance id -> JSON record, exactly as the registering process wrote it."""
    return f"{_prefix()}:{{{service}}}:instances"


def deadlines_key(service):
    """ZSET instance id -> expiry (Redis server time, ms). The TTL of each instance."""
    return f"{_prefix()}:{{{service}}}:deadlines"


def tombstones_key(service):
    """ZSET instance id -> when it was deregistered (ms); a late heartbeat must not bring it back."""
    return f"{_prefix()}:{{{service}}}:tombstones"


def beats_key(service):
    """HASH instance id -> "registered_at_ms last_heartbeat_ms ttl_ms" (Redis server time). Kept apart
    from the record so that Lua never decodes and re-encodes what the service registered."""
    return f"{_prefix()}:{{{service}}}:beats"


def status_key(service):
    """HASH instance id -> "draining" for instances an operator took out of rotation (reversible)."""
    return f"{_prefix()}:{{{service}}}:status"


def changes_key(service):
    """ZSET instance id -> the change number of its last change (registered, re-registered, status
    set, deregistered, expired; not heartbeats): what a client that read the service at an earlier
    change number must fetch again. Trimmed to the live instances plus a few hundred departures."""
    return f"{_prefix()}:{{{service}}}:changes"


def log_key(service):
    """HASH epoch (set when the key is created, so a flush or restart is noticed), v (the last change
    number), floor (changes up to it were trimmed: a client that read before it reads everything)."""
    return f"{_prefix()}:{{{service}}}:log"


def service_keys(service):
    return [records_key(service), deadlines_key(service), tombstones_key(service), beats_key(service),
            status_key(service), changes_key(service), log_key(service)]


def services_key():
    """SET of service names that have (or recently had) instances."""
    return f"{_prefix()}:services"


def sweeper_key():
    """STRING held for one second by the process that sweeps expired instances this second."""
    return f"{_prefix()}:sweeper"


def events_channel():
    """Pub/sub channel of change events: JSON {"event", "service", "instance_id"}."""
    return f"{_prefix()}:events"
