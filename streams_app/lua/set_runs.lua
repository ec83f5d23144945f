-- Set the delivery count of entries (the run ledger's way at maxmemory, streams_app/consuming/runs.py:
-- Redis refuses the running record's HSET then, not XCLAIM); undeliver.lua's job with the ids grouped
-- by count, so a chunk passes one argument per entry.
-- KEYS: stream. ARGV: group, consumer, then groups of: count, number of ids n, n ids.
-- Only entries still owned by this consumer are touched (one another consumer took over is left to
-- it). XCLAIM ... RETRYCOUNT JUSTID sets the count and resets the idle time; allowed at maxmemory.
-- Returns the number of entries whose count was set.
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local set = 0
local i = 3
while i <= #ARGV do
  local count, n = ARGV[i], tonumber(ARGV[i + 1])
  for j = i + 2, i + 1 + n do
    local id = ARGV[j]
    local pending = redis.call('XPENDING', stream, group, id, id, 1)
    if #pending == 1 and pending[1][2] == consumer then
      redis.call('XCLAIM', stream, group, consumer, 0, id, 'RETRYCOUNT', count, 'JUSTID')
      set = set + 1
    end
  end
  i = i + 2 + n
end
return set
