-- The successes of a handler thread's chunk (streams_app/tasks/results.succeeded_many), in one round
-- trip before the chunk's entries are acked. KEYS: the results' hashes. ARGV, five per key: ttl, the
-- attempt number task_started_many.lua gave it, when the task itself started and finished (ISO 8601),
-- its return value (JSON). The started_at of a first attempt and the last_attempted_at of the latest
-- one become the task's own start (the chunk's start was written before it ran).
-- Returns, per key, 1 when written, 0 when the result is gone (nothing written: a half-filled hash
-- nobody can read is worse).
local out = {}
for i, key in ipairs(KEYS) do
  local at = (i - 1) * 5
  local ttl, attempt, started, finished, value = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], ARGV[at + 5]
  if redis.call('HEXISTS', key, 'task') == 1 then
    redis.call('HSET', key, 'status', 'SUCCESSFUL', 'finished_at', finished, 'return_value', value)
    if attempt == '1' then
      redis.call('HSET', key, 'started_at', started)
    end
    if redis.call('HGET', key, 'attempts') == attempt then
      redis.call('HSET', key, 'last_attempted_at', started)
    end
    redis.call('EXPIRE', key, ttl)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
