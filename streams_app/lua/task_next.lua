-- One handler thread's step from a task that succeeded to the next task of its chunk
-- (streams_app/tasks/runner.py): task_finished.lua on KEYS[1], then task_started.lua on KEYS[2], in
-- one round trip. Not on a cluster: the two results' hash tags put them in different slots.
-- ARGV: ttl of KEYS[1], its error ("" for none), the number n of its field/value strings, those n
-- strings, then worker id, now (ISO 8601) and ttl for KEYS[2].
-- Returns {HGETALL of KEYS[1], HGETALL of KEYS[2]}, each false when that result does not exist.
local done, nxt = KEYS[1], KEYS[2]
local err, n = ARGV[2], tonumber(ARGV[3])
local fields = {}
for i = 4, 3 + n do
  fields[#fields + 1] = ARGV[i]
end
local finished = false  -- KEYS[1] gone (expired, or Redis lost its data): nothing written to it
if redis.call('HEXISTS', done, 'task') == 1 then
  if err ~= '' then
    local number = redis.call('HINCRBY', done, 'errors', 1)
    fields[#fields + 1] = 'error.' .. number
    fields[#fields + 1] = err
  end
  redis.call('HSET', done, unpack(fields))
  redis.call('EXPIRE', done, ARGV[1])
  finished = redis.call('HGETALL', done)
end
local worker, now, ttl = ARGV[4 + n], ARGV[5 + n], ARGV[6 + n]
if redis.call('HEXISTS', nxt, 'task') == 0 then
  return {finished, false}
end
if redis.call('HEXISTS', nxt, 'cancelled') == 1 then
  return {finished, redis.call('HGETALL', nxt)}  -- cancelled: not started (task_started.lua)
end
local attempt = redis.call('HINCRBY', nxt, 'attempts', 1)
redis.call('HSET', nxt, 'status', 'RUNNING', 'last_attempted_at', now, 'worker.' .. attempt, worker)
redis.call('HSETNX', nxt, 'started_at', now)
redis.call('EXPIRE', nxt, ttl)
return {finished, redis.call('HGETALL', nxt)}
