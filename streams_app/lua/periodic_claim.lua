-- Claim one tick of a periodic task and enqueue its run, atomically (streams_app/tasks/periodic/scheduler.py).
-- A script runs to its end once Redis has it, whatever becomes of the client: a scheduler SIGKILLed at any
-- moment has claimed and enqueued the tick, or done neither, and a later scheduler (on any host) claims it.
-- The claim hash holds the newest tick enqueued; a tick at or before it is not enqueued again, so
-- schedulers racing on one tick enqueue it once.
-- KEYS: the claim hash, the queue's stream, then (one server) the result hash and the queue's results index;
--       on a cluster only the first two (one slot), and the scheduler writes the result after.
-- ARGV: tick (epoch ms), result id, now (epoch ms, the index's score), result ttl (s), n (the number of
--       result hash fields and values that follow), the n result fields and values, the message's fields and values.
-- Returns 1 when this call enqueued the tick, 0 when it was enqueued already (this tick or a later one),
-- 2 when the tick has not come yet on the Redis clock, {-1, key, type} when a key holds another type
-- (nothing written in those three cases).
local wanted = {'hash', 'stream', 'hash', 'zset'}
for i, name in ipairs(KEYS) do
  local kind = redis.call('TYPE', name).ok
  if kind ~= 'none' and kind ~= wanted[i] then
    return {-1, name, kind}
  end
end
local tick = tonumber(ARGV[1])
local last = redis.call('HGET', KEYS[1], 'tick')
if last and tonumber(last) >= tick then
  return 0
end
-- Redis's clock decides when a tick has come: a host whose clock runs ahead does not enqueue early.
local time = redis.call('TIME')
if tick > tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) then
  return 2
end
local n = tonumber(ARGV[5])
local message = {}
for i = 6 + n, #ARGV do
  message[#message + 1] = ARGV[i]
end
redis.call('XADD', KEYS[2], '*', unpack(message))
redis.call('HSET', KEYS[1], 'tick', ARGV[1], 'id', ARGV[2])
if #KEYS >= 4 then
  local fields = {}
  for i = 6, 5 + n do
    fields[#fields + 1] = ARGV[i]
  end
  redis.call('HSET', KEYS[3], unpack(fields))
  redis.call('EXPIRE', KEYS[3], ARGV[4])
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[2])
end
return 1
