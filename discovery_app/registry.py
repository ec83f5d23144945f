"""``ServiceRegistry``: instances of services in Redis, kept alive by TTL heartbeats.

Each service owns three keys in one cluster slot (see keys.py): a HASH of JSON records, a ZSET
of expiry deadlines and a ZSET of tombstones. Every read and write runs as one Lua script that
first prunes the instances whose deadline passed, so a record and its index entry appear and
disappear together: no reader ever sees an index entry that points at nothing. Deadlines use the
Redis server's clock (TIME), so clients with skewed clocks agree on who is alive.
"""
import ipaddress
import logging
import os
import re
import socket
import uuid
from dataclasses import replace

from redis.commands.core import Script

from discovery_app import keys
from discovery_app.conf import setting
from discovery_app.connection import get_connection
from discovery_app.exceptions import InvalidRegistration, UnknownInstance
from discovery_app.instance import Instance
from shoal_common.text import to_text

logger = logging.getLogger("discovery_app.registry")

_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function publish(event, service, id)
  redis.call('PUBLISH', ARGV[1], cjson.encode({event = event, service = service, instance_id = id}))
end
local function prune(service)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, id in ipairs(dead) do
    redis.call('HDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
    publish('expired', service, id)
  end
  return #dead
end
"""

# KEYS: records, deadlines, tombstones. ARGV: channel, service, id, mode, ttl_ms, tombstone_ms, record.
# mode "register" writes ARGV[7] and clears a tombstone; "heartbeat" refreshes the stored record, or
# writes ARGV[7] again when the record is gone (expired, flushed) unless the id was deregistered.
_WRITE = Script(None, (_PRELUDE + """
local service, id, mode, ttl = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
prune(service)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[6]))
local current = redis.call('HGET', KEYS[1], id)
local record, outcome
if mode == 'heartbeat' and current then
  record = cjson.decode(current)
  outcome = 'alive'
else
  if mode == 'heartbeat' and redis.call('ZSCORE', KEYS[3], id) then
    return {'deregistered', now}
  end
  record = cjson.decode(ARGV[7])
  redis.call('ZREM', KEYS[3], id)
  if mode == 'register' then
    record['registered_at'] = now / 1000
    outcome = 'registered'
  else
    if (tonumber(record['registered_at']) or 0) == 0 then record['registered_at'] = now / 1000 end
    outcome = 'reregistered'
  end
  publish(outcome, service, id)
end
record['last_heartbeat'] = now / 1000
record['ttl'] = ttl / 1000
redis.call('HSET', KEYS[1], id, cjson.encode(record))
redis.call('ZADD', KEYS[2], now + ttl, id)
-- An abandoned service (every instance gone silent, nobody reading) vanishes on its own.
for i = 1, 2 do
  if redis.call('PTTL', KEYS[i]) < 2 * ttl then redis.call('PEXPIRE', KEYS[i], 2 * ttl) end
end
return {outcome, now}
""").encode())

# KEYS: records, deadlines, tombstones. ARGV: channel, service, id, tombstone_ms.
_DEREGISTER = Script(None, (_PRELUDE + """
local service, id = ARGV[2], ARGV[3]
prune(service)
local removed = redis.call('HDEL', KEYS[1], id)
redis.call('ZREM', KEYS[2], id)
redis.call('ZADD', KEYS[3], now, id)
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[4]))
if removed == 1 then publish('deregistered', service, id) end
return removed
""").encode())

# KEYS: records, deadlines. ARGV: channel, service. Returns {now_ms, id1, json1, id2, json2, ...}.
_READ = Script(None, (_PRELUDE + """
prune(ARGV[2])
local out = redis.call('HGETALL', KEYS[1])
table.insert(out, 1, now)
return out
""").encode())


_text = to_text


def validate_service(service):
    if not isinstance(service, str) or not service.strip():
        raise InvalidRegistration(f"service name must be a non-empty string, not {service!r}")
    if any(c in service for c in "{}") or any(c.isspace() for c in service):
        raise InvalidRegistration(
            f"service name {service!r} may not contain braces or whitespace "
            "(braces are the cluster hash tag of its keys)"
        )


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def validate_address(address):
    """A host name or an IP literal, as clients will connect to it; returns it normalised.

    IPv6 may come bracketed ("[::1]", as in a URL) or bare; it is stored bare and bracketed once
    when a URL is built. Anything with a scheme, a port, a path or spaces is refused: the port is
    its own argument, and a URL here would become "http://http://...".
    """
    problem = f"address must be a host name or an IP address (no scheme, port or path), not {address!r}"
    if not isinstance(address, str) or not address:
        raise InvalidRegistration(problem)
    bare = address[1:-1] if address.startswith("[") and address.endswith("]") else address
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        ip = None
    if ip is not None:
        if bare is not address and ip.version != 6:
            raise InvalidRegistration(problem + "; only IPv6 addresses are written in brackets")
        return str(ip) if ip.version == 6 else bare
    labels = address[:-1].split(".") if address.endswith(".") else address.split(".")
    if len(address) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise InvalidRegistration(problem)
    return address


def new_instance_id(service):
    return f"{service}-{os.environ.get('POD_NAME') or socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def build_instance(service, address, port, metadata=None, instance_id=None):
    """Validate a registration and turn it into an Instance (timestamps are set by Redis)."""
    validate_service(service)
    metadata = dict(metadata or {})
    address = validate_address(address)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise InvalidRegistration(f"port must be an integer from 1 to 65535, not {port!r}")
    weight = metadata.pop("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
        raise InvalidRegistration(f"weight must be a number >= 0, not {weight!r}")
    tags = metadata.pop("tags", ()) or ()
    if isinstance(tags, str) or not all(isinstance(tag, str) for tag in tags):
        raise InvalidRegistration(f"tags must be a list of strings, not {tags!r}")
    if instance_id is not None and (not isinstance(instance_id, str) or not instance_id):
        raise InvalidRegistration(f"instance_id must be a non-empty string, not {instance_id!r}")
    return Instance(
        service=service,
        instance_id=instance_id or new_instance_id(service),
        address=address,
        port=port,
        version=str(metadata.pop("version", "") or ""),
        zone=metadata.pop("zone", None) or None,
        weight=float(weight),
        tags=tuple(tags),
        extra=metadata,
    )


class ServiceRegistry:
    def __init__(self, connection=None, ttl=None):
        self._connection = connection
        self.ttl = float(setting("TTL") if ttl is None else ttl)
        if self.ttl <= 0:
            raise InvalidRegistration(f"ttl must be positive, not {ttl!r}")
        # Records this object registered: enough to re-register one whose key has gone.
        self._owned: dict[str, Instance] = {}

    @property
    def connection(self):
        # Looked up on every use: django-redis hands each (forked) process its own client.
        return self._connection if self._connection is not None else get_connection()

    # -- writers ---------------------------------------------------------------------------

    def register(self, service, address, port, metadata=None, instance_id=None, pipeline=None):
        instance = build_instance(service, address, port, metadata, instance_id)
        self._owned[instance.instance_id] = instance
        _, now = self._write(instance, "register", pipeline)
        if now is not None:  # not pipelined: it is done
            instance = replace(instance, registered_at=now, last_heartbeat=now, ttl=self.ttl)
            self._owned[instance.instance_id] = instance
            logger.info("Discovery: registered %s of %s at %s", instance.instance_id, service, instance.url)
        return instance

    def heartbeat(self, instance_id, pipeline=None):
        """Refresh an instance's TTL. Returns "alive", "reregistered" (its record had gone and was
        written again) or "deregistered" (an operator removed it: it stays removed).
        With a pipeline, the outcome is in the pipeline's results instead."""
        instance = self._owned.get(instance_id)
        if instance is None:
            raise UnknownInstance(
                f"instance {instance_id!r} was not registered through this ServiceRegistry; "
                "call register() first (a heartbeat must be able to re-register the full record)"
            )
        outcome, _ = self._write(instance, "heartbeat", pipeline)
        if outcome == "reregistered":
            logger.warning("Discovery: %s of %s had expired or been flushed; registered it again",
                           instance_id, instance.service)
        elif outcome == "deregistered":
            logger.warning("Discovery: %s of %s was deregistered; not registering it again",
                           instance_id, instance.service)
        return outcome

    def deregister(self, instance_id, pipeline=None, service=None):
        """Remove an instance. ``instance_id`` may be an Instance; ``service`` is needed for an id
        this object did not register (e.g. from an admin page). Returns True if it was registered."""
        if isinstance(instance_id, Instance):
            service, instance_id = instance_id.service, instance_id.instance_id
        owned = self._owned.pop(instance_id, None)
        service = service or (owned.service if owned else None)
        if service is None:
            raise UnknownInstance(f"instance {instance_id!r} is unknown here; pass service= to deregister it")
        validate_service(service)
        conn = pipeline if pipeline is not None else self.connection
        result = _DEREGISTER(
            keys=keys.service_keys(service),
            args=[keys.events_channel(), service, instance_id, int(setting("TOMBSTONE_TTL") * 1000)],
            client=conn,
        )
        if pipeline is None:
            logger.info("Discovery: deregistered %s of %s", instance_id, service)
            return bool(result)
        return None

    def _write(self, instance, mode, pipeline):
        pipe = pipeline if pipeline is not None else self.connection.pipeline(transaction=False)
        # The services set lives in another slot, so it is written beside the script, not in it;
        # every heartbeat re-adds the name in case services() dropped it while it was empty.
        pipe.sadd(keys.services_key(), instance.service)
        _WRITE(
            keys=keys.service_keys(instance.service),
            args=[keys.events_channel(), instance.service, instance.instance_id, mode,
                  int(self.ttl * 1000), int(setting("TOMBSTONE_TTL") * 1000), instance.to_json()],
            client=pipe,
        )
        if pipeline is not None:
            return None, None
        reply = pipe.execute()[-1]
        return _text(reply[0]), int(reply[1]) / 1000

    # -- readers ---------------------------------------------------------------------------

    def instances(self, service):
        """Live instances of ``service``, sorted by id; expired ones are pruned on the way."""
        return self.fetch(service)[1]

    def fetch(self, service):
        """(Redis server time in epoch seconds, live instances): the clock lets a caller judge
        heartbeat ages without trusting its own."""
        validate_service(service)
        reply = _READ(keys=keys.service_keys(service)[:2], args=[keys.events_channel(), service],
                      client=self.connection)
        found = []
        for raw in reply[2::2]:
            try:
                found.append(Instance.from_json(_text(raw)))
            except (ValueError, KeyError, TypeError):
                logger.warning("Discovery: skipping an unreadable record of %s: %r", service, raw[:200])
        return int(reply[0]) / 1000, sorted(found, key=lambda i: i.instance_id)

    def services(self):
        """Names of the services with at least one live instance, sorted.

        Names whose instances have all gone are dropped from the services set; a name dropped by
        mistake (a registration racing the clean-up) is added back by that instance's next heartbeat.
        """
        conn = self.connection
        names = sorted(_text(name) for name in conn.smembers(keys.services_key()))
        if not names:
            return []
        pipe = conn.pipeline(transaction=False)
        for name in names:
            _READ(keys=keys.service_keys(name)[:2], args=[keys.events_channel(), name], client=pipe)
        replies = pipe.execute()
        alive = [name for name, reply in zip(names, replies) if len(reply) > 1]
        gone = [name for name, reply in zip(names, replies) if len(reply) <= 1]
        if gone:
            conn.srem(keys.services_key(), *gone)
        return alive

    def all_instances(self):
        """{service: [Instance, ...]} for every live service: what an admin page lists."""
        return {name: self.instances(name) for name in self.services()}
