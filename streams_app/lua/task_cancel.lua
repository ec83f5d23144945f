-- Cancel a task that has not started (streams_app/tasks/cancelling.cancel), atomically with every start:
-- the start scripts (task_started, task_started_many, task_next) never start a result marked cancelled,
-- so a worker that already read the message, or reads it later (a deferred or retried run), acks it unrun.
-- KEYS: the result's hash. ARGV: now (ISO 8601), the error (JSON), ttl in seconds.
-- Returns 1 when the result is cancelled (by this call, or an earlier one), 0 when it cannot be
-- (RUNNING, SUCCESSFUL, FAILED, or there is no such result).
local key, now, err, ttl = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
if redis.call('HEXISTS', key, 'cancelled') == 1 then
  return 1
end
if redis.call('HGET', key, 'status') ~= 'READY' or redis.call('HEXISTS', key, 'task') == 0 then
  return 0
end
local number = redis.call('HINCRBY', key, 'errors', 1)
redis.call('HSET', key, 'status', 'FAILED', 'finished_at', now, 'cancelled', now, 'error.' .. number, err)
redis.call('EXPIRE', key, ttl)
return 1
