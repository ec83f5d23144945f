-- KEYS[1] = {stream}:consumers. ARGV[1] = grace in ms, ARGV[2..] = names to keep (they hold entries).
-- Removes the names whose deadline passed more than the grace ago, on the Redis clock; returns them.
-- A worker SIGKILLed before its first read never became a consumer of any group (Redis 7.0 creates
-- none for an empty blocking read), so no group clean-up would ever forget it.
local now = redis.call('TIME')
local cutoff = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - tonumber(ARGV[1])
local keep = {}
for i = 2, #ARGV do
  keep[ARGV[i]] = true
end
local gone = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) < cutoff and not keep[all[i]] then
    gone[#gone + 1] = all[i]
  end
end
if #gone > 0 then
  redis.call('HDEL', KEYS[1], unpack(gone))
end
return gone
