-- KEYS[1] = {stream}:consumers (hash: consumer name -> deadline, ms of the Redis clock)
-- ARGV[1] = consumer name, ARGV[2] = ttl in ms, ARGV[3] = "forget" to remove it
-- Redis's clock, not the caller's: consumers on hosts with skewed clocks still agree.
if ARGV[3] == "forget" then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now_ms + tonumber(ARGV[2]))
return now_ms
