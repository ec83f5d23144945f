"""``ServiceRegistry``: instances of services in Redis, kept alive by TTL heartbeats.

Each service owns three keys in one cluster slot (see keys.py): a HASH of JSON records, a ZSET
of expiry deadlines and a ZSET of tombstones. Every read and write runs as one Lua script that
first prunes the instances whose deadline passed, so a record and its index entry appear and
disappear together: no reader ever sees an index entry that points at nothing. Deadlines use the
Redis server's clock (TIME), so clients with skewed clocks agree on who is alive. What a
registration must be before it is written (a service name, an address...) is registration.py's.
"""
import logging
import os
import uuid
from dataclasses import replace
from typing import NamedTuple

from redis.commands.core import Script

from discovery_app import keys
from discovery_app.conf import setting
from discovery_app.connection import is_cluster, per_slot, slot_pipeline
from discovery_app.exceptions import InvalidRegistration, UnknownInstance
from discovery_app.instance import Instance
from discovery_app.registration import build_instance, validate_service
from discovery_app.short_timeout import registry_connection
from shoal_common.text import to_text

logger = logging.getLogger("discovery_app.registry")

_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function publish(event, service, id)
  redis.call('PUBLISH', ARGV[1], cjson.encode({event = event, service = service, instance_id = id}))
end
-- The change log (KEYS[6] changes, KEYS[7] log): every change but a heartbeat gets the next number,
-- so a client that read at number v fetches only the ids changed since (see _READ_CHANGES).
local function changed(id)
  if redis.call('HEXISTS', KEYS[7], 'epoch') == 0 then
    redis.call('HSET', KEYS[7], 'epoch', tostring(now), 'v', 0, 'floor', 0)
  end
  local v = redis.call('HINCRBY', KEYS[7], 'v', 1)
  redis.call('ZADD', KEYS[6], v, id)
  -- Departed ids stay listed so that clients learn of the departure; beyond a few hundred of them the
  -- oldest entries go, and a client that read before the floor reads everything again.
  local extra = redis.call('ZCARD', KEYS[6]) - redis.call('HLEN', KEYS[1]) - 512
  if extra > 0 then
    local oldest = redis.call('ZRANGE', KEYS[6], extra - 1, extra - 1, 'WITHSCORES')
    redis.call('ZREMRANGEBYRANK', KEYS[6], 0, extra - 1)
    redis.call('HSET', KEYS[7], 'floor', oldest[2])
  end
end
-- At most 1,000 expiries per call keeps one script's time on Redis bounded when a whole fleet
-- goes silent at once; the sweep and the next readers take the rest.
local function prune(service)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1000)
  for _, id in ipairs(dead) do
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[4], id)
    -- The operator's drain stays: the same instance re-registered by its next heartbeat is still
    -- drained (a flaky instance is what gets drained). A new process's register clears it.
    redis.call('HDEL', KEYS[5], 'health:' .. id)
    redis.call('ZREM', KEYS[2], id)
    changed(id)
    publish('expired', service, id)
  end
  return #dead
end
"""

# KEYS: keys.service_keys (records, deadlines, tombstones, beats, status, changes, log).
# ARGV: channel, service, id, mode, ttl_ms, tombstone_ms, record, registered_at_ms (0: unknown), registration.
# mode "register" writes ARGV[7] and clears a tombstone; "heartbeat" refreshes the beat, or writes
# ARGV[7] again when the record is gone (expired, flushed) unless the id was deregistered. A heartbeat
# refreshes only its own registration: when the record is another registration's (another live process
# uses the same id), it returns {'conflict', now, that record} and touches nothing, so the other's record
# expires once that process stops. The record is stored as given and only decoded to read its
# registration: cjson would turn 12345678901234567 into 1.2345678901235e+16 and [] into {}. Times live
# in the beats hash.
_WRITE = Script(None, (_PRELUDE + """
local service, id, mode, ttl = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
prune(service)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[6]))
local registered_at, outcome
if mode == 'heartbeat' and redis.call('HEXISTS', KEYS[1], id) == 1 then
  local current = redis.call('HGET', KEYS[1], id)
  local ok, decoded = pcall(cjson.decode, current)
  local theirs = ok and type(decoded) == 'table' and decoded['registration']
  if ARGV[9] ~= '' and type(theirs) == 'string' and theirs ~= '' and theirs ~= ARGV[9] then
    return {'conflict', now, current}
  end
  local beat = redis.call('HGET', KEYS[4], id)
  registered_at = (beat and tonumber(string.match(beat, '^(%d+)'))) or now
  outcome = 'alive'
else
  if mode == 'heartbeat' and redis.call('ZSCORE', KEYS[3], id) then
    return {'deregistered', now}
  end
  redis.call('HSET', KEYS[1], id, ARGV[7])
  redis.call('ZREM', KEYS[3], id)
  if mode == 'register' then redis.call('HDEL', KEYS[5], id, 'health:' .. id) end  -- a new process starts in rotation
  registered_at = now
  if mode == 'register' then
    outcome = 'registered'
  else
    outcome = 'reregistered'  -- the same instance, back after its record was lost: keep its age
    if tonumber(ARGV[8]) > 0 then registered_at = tonumber(ARGV[8]) end
  end
  changed(id)
  publish(outcome, service, id)
end
redis.call('HSET', KEYS[4], id, string.format('%d %d %d', registered_at, now, ttl))
redis.call('ZADD', KEYS[2], now + ttl, id)
-- An abandoned service (every instance gone silent, nobody reading) vanishes on its own.
for _, i in ipairs({1, 2, 4, 5, 6, 7}) do
  if redis.call('PTTL', KEYS[i]) < 2 * ttl then redis.call('PEXPIRE', KEYS[i], 2 * ttl) end
end
return {outcome, now}
""").encode())

# KEYS: keys.service_keys. ARGV: channel, service, id, tombstone_ms, registration.
# A non-empty registration removes the record only if it is still that registration's: -1 otherwise
# (someone registered the same id since), and no tombstone, which would stop the newer one's heartbeats.
_DEREGISTER = Script(None, (_PRELUDE + """
local service, id, registration = ARGV[2], ARGV[3], ARGV[5]
prune(service)
if registration ~= '' then
  local current = redis.call('HGET', KEYS[1], id)
  if not current then return 0 end
  if cjson.decode(current)['registration'] ~= registration then return -1 end
end
local removed = redis.call('HDEL', KEYS[1], id)
redis.call('HDEL', KEYS[4], id)
redis.call('HDEL', KEYS[5], id, 'health:' .. id)
redis.call('ZREM', KEYS[2], id)
redis.call('ZADD', KEYS[3], now, id)
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[4]))
if removed == 1 then
  changed(id)
  publish('deregistered', service, id)
end
return removed
""").encode())

# KEYS: all seven. ARGV: channel, service.
# Returns {now_ms, {id1, json1, ...}, {id1, beat1, ...}, {id, status, ...}, epoch or false, v}.
_READ = Script(None, (_PRELUDE + """
prune(ARGV[2])
local log = redis.call('HMGET', KEYS[7], 'epoch', 'v')
return {now, redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[4]), redis.call('HGETALL', KEYS[5]),
        log[1], tonumber(log[2] or '0')}
""").encode())

# KEYS: all seven. ARGV: channel, service, epoch, since (a change number), window_ms, most.
# What changed since change number ``since`` of ``epoch``: {'changes', now_ms, v, {id, record or '',
# beat or '', status or '', health or '', ...}, {id, beat, ...} of the instances whose deadline falls
# within window_ms}; or {'full'} when the caller must read everything (another epoch: the keys were
# flushed or expired; trimmed past ``since``; more than ``most`` changes or aging instances).
_READ_CHANGES = Script(None, (_PRELUDE + """
prune(ARGV[2])
local most = tonumber(ARGV[6])
local log = redis.call('HMGET', KEYS[7], 'epoch', 'v', 'floor')
local since, v = tonumber(ARGV[4]), tonumber(log[2] or '0')
if log[1] ~= ARGV[3] or since < tonumber(log[3] or '0') or since > v then return {'full'} end
local ids = redis.call('ZRANGEBYSCORE', KEYS[6], '(' .. since, '+inf', 'LIMIT', 0, most + 1)
local aging = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now + tonumber(ARGV[5]), 'LIMIT', 0, most + 1)
if #ids > most or #aging > most then return {'full'} end
local found = {}
for _, id in ipairs(ids) do
  table.insert(found, id)
  table.insert(found, redis.call('HGET', KEYS[1], id) or '')
  table.insert(found, redis.call('HGET', KEYS[4], id) or '')
  table.insert(found, redis.call('HGET', KEYS[5], id) or '')
  table.insert(found, redis.call('HGET', KEYS[5], 'health:' .. id) or '')
end
local beats = {}
for _, id in ipairs(aging) do
  table.insert(beats, id)
  table.insert(beats, redis.call('HGET', KEYS[4], id) or '')
end
return {'changes', now, v, found, beats}
""").encode())

# KEYS: all five. ARGV: channel, service, id, field, value ("" removes it), event.
# The status hash holds the operator's "draining" under the instance id and the registrar's health
# check under "health:<id>", so neither undoes the other. 1 if the instance is registered, else 0.
_SET_STATUS = Script(None, (_PRELUDE + """
prune(ARGV[2])
if redis.call('HEXISTS', KEYS[1], ARGV[3]) == 0 then return 0 end
if ARGV[5] == '' then
  if redis.call('HDEL', KEYS[5], ARGV[4]) == 0 then return 1 end
else
  if redis.call('HGET', KEYS[5], ARGV[4]) == ARGV[5] then return 1 end
  redis.call('HSET', KEYS[5], ARGV[4], ARGV[5])
  redis.call('PEXPIRE', KEYS[5], math.max(redis.call('PTTL', KEYS[1]), 1000))
end
changed(ARGV[3])
publish(ARGV[6], ARGV[2], ARGV[3])
return 1
""").encode())


# KEYS: keys.service_keys. ARGV: channel, service. Prunes only (a sweep).
_PRUNE = Script(None, (_PRELUDE + """
return prune(ARGV[2])
""").encode())


_text = to_text


class ServiceRegistry:
    def __init__(self, connection=None, ttl=None):
        self._connection = connection
        self.ttl = float(setting("TTL") if ttl is None else ttl)
        if self.ttl <= 0:
            raise InvalidRegistration(f"ttl must be positive, not {ttl!r}")
        # Records this object registered: enough to re-register one whose key has gone.
        self._owned: dict[str, Instance] = {}
        self._conflicts: dict[str, str] = {}  # instance id -> the other registration's URL, while reported

    @property
    def connection(self):
        # Looked up on every use: django-redis hands each (forked) process its own pool, and the
        # registry's calls get DISCOVERY["REDIS_TIMEOUT"] rather than the shared pool's 5 s.
        return self._connection if self._connection is not None else registry_connection()

    # -- writers ---------------------------------------------------------------------------

    def pipeline(self, service):
        """A pipeline the writers of ``service`` accept (``pipeline=``) on one server and on a cluster.

        On a cluster it is a plain pipeline on the node that holds the service's keys: a cluster
        pipeline refuses the writers' scripts.
        """
        return slot_pipeline(self.connection, keys.service_keys(service)[0])

    def register(self, service, address, port, metadata=None, instance_id=None, pipeline=None):
        instance = replace(build_instance(service, address, port, metadata, instance_id),
                           registration=uuid.uuid4().hex)
        self._owned[instance.instance_id] = instance
        self._conflicts.pop(instance.instance_id, None)
        _, now, _ = self._write(instance, "register", pipeline)
        if now is not None:  # not pipelined: it is done
            instance = replace(instance, registered_at=now, last_heartbeat=now, ttl=self.ttl)
            self._owned[instance.instance_id] = instance
            logger.info("Discovery: registered %s of %s at %s", instance.instance_id, service, instance.url)
        return instance

    def heartbeat(self, instance_id, pipeline=None):
        """Refresh an instance's TTL. Returns "alive", "reregistered" (its record had gone and was
        written again), "deregistered" (an operator removed it: it stays removed) or "conflict" (another
        registration of the same id holds the record: left alone, and reported once).
        With a pipeline, the outcome is in the pipeline's results instead."""
        instance = self._owned.get(instance_id)
        if instance is None:
            raise UnknownInstance(
                f"instance {instance_id!r} was not registered through this ServiceRegistry; "
                "call register() first (a heartbeat must be able to re-register the full record)"
            )
        outcome, _, other = self._write(instance, "heartbeat", pipeline)
        if outcome == "conflict":
            self._report_conflict(instance, other)
            return outcome
        if outcome == "reregistered":
            if self._conflicts.pop(instance_id, None) is not None:
                logger.warning("Discovery: %s of %s: the other process's record of this id expired; this "
                               "process (%s) is registered again", instance_id, instance.service, instance.url)
            else:
                logger.warning("Discovery: %s of %s had expired or been flushed; registered it again",
                               instance_id, instance.service)
        elif outcome == "deregistered":
            logger.warning("Discovery: %s of %s was deregistered; not registering it again",
                           instance_id, instance.service)
        elif outcome == "alive":
            self._conflicts.pop(instance_id, None)
        return outcome

    def _report_conflict(self, instance, other):
        # Once per episode: heartbeats come every few seconds. Two live processes with one id would
        # otherwise refresh each other's record for ever (a dead one's port stayed listed) or take it
        # from each other at every beat.
        try:
            found = Instance.from_json(_text(other)).url
        except (ValueError, KeyError, TypeError):
            found = "an unreadable record"
        if self._conflicts.get(instance.instance_id) == found:
            return
        self._conflicts[instance.instance_id] = found
        logger.warning("Discovery: %s of %s is registered by another process (%s): two live processes use this "
                       "instance id. This one's heartbeats leave that record alone, so it (%s) is not listed while "
                       "the other lives, and takes over when the other's record expires. Give each process its "
                       "own instance_id.", instance.instance_id, instance.service, found, instance.url)

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
            args=[keys.events_channel(), service, instance_id, int(setting("TOMBSTONE_TTL") * 1000),
                  owned.registration if owned else ""],
            client=conn,
        )
        if pipeline is None:
            if result == -1:
                logger.warning("Discovery: left %s of %s registered: another process registered the same "
                               "instance id since", instance_id, service)
                return False
            logger.info("Discovery: deregistered %s of %s", instance_id, service)
            return bool(result)
        return None

    def _write(self, instance, mode, pipeline):
        # The services set lives in another slot, so it is written beside the script, not in it;
        # every heartbeat re-adds the name in case services() dropped it while it was empty.
        if is_cluster(self.connection):
            # The set is on another node: written on its own; the script on the service's node.
            self.connection.sadd(keys.services_key(), instance.service)
            pipe = pipeline if pipeline is not None else self.pipeline(instance.service)
        else:
            pipe = pipeline if pipeline is not None else self.connection.pipeline(transaction=False)
            pipe.sadd(keys.services_key(), instance.service)
        _WRITE(
            keys=keys.service_keys(instance.service),
            args=[keys.events_channel(), instance.service, instance.instance_id, mode,
                  int(self.ttl * 1000), int(setting("TOMBSTONE_TTL") * 1000), instance.to_json(),
                  int(instance.registered_at * 1000), instance.registration],
            client=pipe,
        )
        if pipeline is not None:
            return None, None, None
        reply = pipe.execute()[-1]
        return _text(reply[0]), int(reply[1]) / 1000, (reply[2] if len(reply) > 2 else None)

    # -- readers ---------------------------------------------------------------------------

    def instances(self, service):
        """Live instances of ``service``, sorted by id; expired ones are pruned on the way."""
        return self.fetch(service)[1]

    def fetch(self, service):
        """(Redis server time in epoch seconds, live instances): the clock lets a caller judge
        heartbeat ages without trusting its own."""
        read = self.read(service)
        return read.server_now, read.instances

    def read(self, service):
        """Every live instance of ``service``, with the change position to pass to ``read_changes``."""
        validate_service(service)
        reply = _READ(keys=keys.service_keys(service), args=[keys.events_channel(), service],
                      client=self.connection)
        records, beats, status = reply[1], reply[2], reply[3]
        beat_of = {_text(beats[n]): _text(beats[n + 1]) for n in range(0, len(beats), 2)}
        marks = {(_text(status[n]), _text(status[n + 1])) for n in range(0, len(status), 2)}
        draining = {field for field, value in marks if value == "draining"}
        failing = {field.removeprefix("health:") for field, value in marks if value == "failing"}
        found = []
        for n in range(0, len(records), 2):
            instance_id, raw = _text(records[n]), records[n + 1]
            instance = _decode(service, raw, beat_of.get(instance_id), instance_id in draining, instance_id in failing)
            if instance is not None:
                found.append(instance)
        now = int(reply[0]) / 1000
        # A script prunes at most 1,000 expired instances; any beyond that are dead all the same.
        found = [i for i in found if not _expired(i, now)]
        position = (_text(reply[4]), int(reply[5])) if reply[4] else None
        return Read(now, sorted(found, key=lambda i: i.instance_id), position)

    def read_changes(self, service, position, window, most=1000):
        """What changed in ``service`` since the ``read``/``read_changes`` that returned ``position``:
        a ``Changes``, or None when the caller must ``read`` everything (Redis was flushed or
        restarted, the log was trimmed past ``position``, more than ``most`` changes). Heartbeats
        are not changes: ``Changes.aging`` has the exact heartbeat of the instances whose deadline is
        less than ``window`` seconds away; every other live instance's deadline is further away."""
        validate_service(service)
        if position is None:
            return None
        epoch, since = position
        reply = _READ_CHANGES(keys=keys.service_keys(service),
                              args=[keys.events_channel(), service, epoch, since, max(0, int(window * 1000)), most],
                              client=self.connection)
        if _text(reply[0]) != "changes":
            return None
        found, beats = reply[3], reply[4]
        changed = {}
        for n in range(0, len(found), 5):
            instance_id, raw, beat, status, health = (_text(value) for value in found[n:n + 5])
            changed[instance_id] = _decode(service, raw, beat or None, status == "draining", health == "failing") \
                if raw else None
        now = int(reply[1]) / 1000
        aging = {}
        for n in range(0, len(beats), 2):
            instance_id, beat = _text(beats[n]), _text(beats[n + 1]).split()
            if len(beat) == 3:
                last_heartbeat, ttl = int(beat[1]) / 1000, int(beat[2]) / 1000
                if last_heartbeat + ttl <= now:  # expired, not pruned yet (more than one script's worth)
                    changed[instance_id] = None
                else:
                    aging[instance_id] = last_heartbeat
        return Changes(now, changed, aging, (epoch, int(reply[2])), window)

    def set_draining(self, service, instance_id, draining=True):
        """Take an instance out of rotation (clients stop picking it while others remain) or put it
        back, without touching its process; heartbeats keep it registered meanwhile. Returns False
        if it is not registered."""
        validate_service(service)
        done = _SET_STATUS(keys=keys.service_keys(service),
                           args=[keys.events_channel(), service, instance_id, instance_id,
                                 "draining" if draining else "", "draining" if draining else "undrained"],
                           client=self.connection)
        if done:
            logger.info("Discovery: %s of %s %s", instance_id, service, "is draining" if draining else "is back in rotation")
        return bool(done)

    def set_health(self, service, instance_id, failing):
        """Record the outcome of an instance's active health check (Registrar ``health_check``):
        failing instances are skipped by clients while others remain. False if not registered."""
        validate_service(service)
        return bool(_SET_STATUS(keys=keys.service_keys(service),
                                args=[keys.events_channel(), service, instance_id, f"health:{instance_id}",
                                      "failing" if failing else "", "failing" if failing else "passing"],
                                client=self.connection))

    def tombstoned(self, service, instance_ids):
        """The ids among ``instance_ids`` deregistered in the last TOMBSTONE_TTL."""
        validate_service(service)
        if not instance_ids:
            return set()
        scores = self.connection.zmscore(keys.service_keys(service)[2], instance_ids)
        return {instance_id for instance_id, score in zip(instance_ids, scores) if score is not None}

    def sweep(self, period=1.0):
        """Expire (and announce) every instance whose deadline has passed, in every service, unless
        another process swept in the last ``period`` seconds. Returns the number expired, or None
        when it was someone else's turn. Without it an expiry is noticed only when somebody next
        touches the service; DiscoveryClients' shared listeners call it every second."""
        conn = self.connection
        if not conn.set(keys.sweeper_key(), os.getpid(), nx=True, px=max(1, int(period * 1000))):
            return None
        names = sorted(_text(name) for name in conn.smembers(keys.services_key()))
        if not names:
            return 0
        expired = 0
        for pipe, node_names in _per_node(conn, names):  # scripts: one plain pipeline per node on a cluster
            for name in node_names:
                _PRUNE(keys=keys.service_keys(name), args=[keys.events_channel(), name], client=pipe)
            expired += sum(pipe.execute())
        if expired:
            logger.info("Discovery: the sweep expired %d instance(s)", expired)
        return expired

    def services(self):
        """Names of the services with at least one live instance, sorted.

        Names whose instances have all gone are dropped from the services set; a name dropped by
        mistake (a registration racing the clean-up) is added back by that instance's next heartbeat.
        """
        conn = self.connection
        names = sorted(_text(name) for name in conn.smembers(keys.services_key()))
        if not names:
            return []
        replies = {}
        # One plain pipeline per node: a cluster pipeline refuses scripts (one pipeline on one server).
        for pipe, node_names in _per_node(conn, names):
            for name in node_names:
                _READ(keys=keys.service_keys(name), args=[keys.events_channel(), name], client=pipe)
            replies.update(zip(node_names, pipe.execute()))
        replies = [replies[name] for name in names]
        alive = [name for name, reply in zip(names, replies) if reply[1]]
        gone = [name for name, reply in zip(names, replies) if not reply[1]]
        if gone:
            conn.srem(keys.services_key(), *gone)
        return alive

    def all_instances(self):
        """{service: [Instance, ...]} for every live service: what an admin page lists."""
        return {name: self.instances(name) for name in self.services()}


class Read(NamedTuple):
    server_now: float  # epoch seconds, Redis server clock
    instances: list
    position: tuple | None  # (epoch, change number) for read_changes; None before the first change


class Changes(NamedTuple):
    server_now: float
    changed: dict  # instance id -> Instance, or None where it left (deregistered or expired)
    aging: dict  # instance id -> last heartbeat (epoch seconds) of those whose deadline is near
    position: tuple
    window: float  # every live instance not in ``aging`` has its deadline at least this far away


def _expired(instance, now):
    return not instance.is_fallback and instance.last_heartbeat + instance.ttl <= now


def _decode(service, raw, beat, draining, failing):
    try:
        instance = Instance.from_json(_text(raw), beat)
    except (ValueError, KeyError, TypeError):
        logger.warning("Discovery: skipping an unreadable record of %s: %r", service, raw[:200])
        return None
    if draining or failing:
        instance = replace(instance, draining=draining, failing=failing)
    return instance


def _per_node(conn, names):
    """``[(pipeline, service names)]`` grouped by the node that holds each service's keys."""
    by_key = {keys.service_keys(name)[0]: name for name in names}
    return [(pipe, [by_key[k] for k in node_keys]) for pipe, node_keys in per_slot(conn, list(by_key))]
