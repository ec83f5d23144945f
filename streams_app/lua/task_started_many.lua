-- A chunk of task attempts starts (streams_app/tasks/results.started_many): task_started.lua for each
-- result of a handler thread's chunk, in one round trip. Not on a cluster (the results' hash tags
-- put them in different slots). KEYS: the results' hashes. ARGV: worker id, now (ISO 8601), then the
-- ttl of each key. A result that does not exist is not written (an outbox enqueue whose READY is not
-- written yet, an expired one: its task starts alone, streams_app/tasks/runner.py).
-- Returns, per key, its attempt number and its number of errors so far ({0, 0} when it does not exist).
local worker, now = ARGV[1], ARGV[2]
local out = {}
for i, key in ipairs(KEYS) do
  -- A cancelled result (task_cancel.lua) is not started: {0, 0}, and the task's own call finds it cancelled.
  if redis.call('HEXISTS', key, 'task') == 1 and redis.call('HEXISTS', key, 'cancelled') == 0 then
    local attempt = redis.call('HINCRBY', key, 'attempts', 1)
    redis.call('HSET', key, 'status', 'RUNNING', 'last_attempted_at', now, 'worker.' .. attempt, worker)
    redis.call('HSETNX', key, 'started_at', now)
    redis.call('EXPIRE', key, ARGV[2 + i])
    out[#out + 1] = attempt
    out[#out + 1] = tonumber(redis.call('HGET', key, 'errors') or '0')
  else
    out[#out + 1] = 0
    out[#out + 1] = 0
  end
end
return out
