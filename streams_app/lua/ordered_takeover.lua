-- Ordered mode: a new owner of a partition takes every pending entry of it (whoever held them),
-- without counting a delivery (JUSTID), so it can hand them out again in id order before new ones.
-- KEYS: stream, lease. ARGV: group, consumer, token.
-- Returns the number of entries taken, or false (nil) when the lease is not the caller's.
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return false end
local cursor, taken = '0-0', 0
repeat
  local reply = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, cursor, 'COUNT', 1000, 'JUSTID')
  cursor = reply[1]
  taken = taken + #reply[2]
until cursor == '0-0'
return taken
