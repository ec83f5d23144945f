-- A task attempt starts (streams_app/tasks/results.started): one round trip instead of an HINCRBY
-- and a MULTI, and nothing is written to a result that does not exist (an outbox enqueue whose
-- READY is not written yet, or an expired one: the caller creates it, then starts it).
-- KEYS: the result's hash. ARGV: worker id, now (ISO 8601), ttl in seconds.
-- The attempt is numbered by HINCRBY and writes its own field worker.<n>, so two workers running
-- the same task (a takeover of one that was only slow) never overwrite each other's entry.
-- Returns the hash after the write (HGETALL's flat list), or nil when there is no result.
local key, worker, now, ttl = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
if redis.call('HEXISTS', key, 'task') == 0 then
  return false
end
if redis.call('HEXISTS', key, 'cancelled') == 1 then
  return redis.call('HGETALL', key)  -- cancelled (task_cancel.lua): not started; the caller acks it unrun
end
local attempt = redis.call('HINCRBY', key, 'attempts', 1)
redis.call('HSET', key, 'status', 'RUNNING', 'last_attempted_at', now, 'worker.' .. attempt, worker)
redis.call('HSETNX', key, 'started_at', now)
redis.call('EXPIRE', key, ttl)
return redis.call('HGETALL', key)
