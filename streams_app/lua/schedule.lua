-- Schedule messages of one stream for deferred delivery (streams_app/publishing/scheduled.py).
-- KEYS: the stream, its scheduled set ({S}:scheduled), its scheduled data ({S}:scheduled:data).
-- ARGV: 'in' (each due time is a delay in ms from now, on this server's clock) or 'at' (epoch ms),
--       then per message: scheduled id, due, fields (a netstring list: maxlen or '', then names and values).
-- Each message goes into the set (score: due, ms) and the data hash (its fields) together. A scheduled
-- id already there is left as it was: an outbox relay that sends a row again schedules it once.
-- Returns {added, now ms}, or {-1, key, type} with nothing stored when a key holds another type.
local expected = {'stream', 'zset', 'hash'}
for i = 1, 3 do
  local kind = redis.call('TYPE', KEYS[i]).ok
  if kind ~= 'none' and kind ~= expected[i] then
    return {-1, KEYS[i], kind}
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local base = 0
if ARGV[1] == 'in' then
  base = now
end
local added = 0
for i = 2, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[3], ARGV[i], ARGV[i + 2]) == 1 then
    redis.call('ZADD', KEYS[2], string.format('%.0f', base + tonumber(ARGV[i + 1])), ARGV[i])
    added = added + 1
  end
end
return {added, now}
