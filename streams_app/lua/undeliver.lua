-- Take back the delivery count of entries whose handler never ran (the redis guard's marks were
-- refused at maxmemory, or another consumer is running the same key), so that such deliveries never
-- count towards max_deliveries and never make the reclaim daemon dead-letter an entry that never ran.
-- The run ledger (streams_app/consuming/runs.py) sets counts the same way with set_runs.lua.
-- KEYS: stream. ARGV: group, consumer, then per entry: id, the deliveries that ran.
-- Only entries still owned by this consumer are touched (one another consumer took over is left to
-- it). XCLAIM ... RETRYCOUNT JUSTID sets the count and resets the idle time; it is allowed at maxmemory.
-- Returns the number of entries whose count was set.
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local set = 0
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', stream, group, id, id, 1)
  if #pending == 1 and pending[1][2] == consumer then
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'RETRYCOUNT', ARGV[i + 1], 'JUSTID')
    set = set + 1
  end
end
return set
