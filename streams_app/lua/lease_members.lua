-- Ordered mode's membership: a member's deadline in {S}:members:<group>, on the Redis clock.
-- KEYS: members hash. ARGV: member, ttl ms (0: leave).
-- Returns the live members (deadline not passed); lapsed ones are removed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[2] == '0' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], now + tonumber(ARGV[2]))
end
local live = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) >= now then
    live[#live + 1] = all[i]
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return live
