-- KEYS[1] = {stream}:consumers. Returns the names whose deadline has passed on the Redis clock.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local dead = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) < now_ms then
    dead[#dead + 1] = all[i]
  end
end
return dead
