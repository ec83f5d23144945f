-- Ordered mode: hand out again, in id order, entries pending for this consumer, while holding the lease.
-- KEYS: stream, lease. ARGV: group, consumer, token, head id, then the ids after it.
-- The head is claimed (a counted delivery: it is the entry being retried); the ones after it are only
-- read (XRANGE), so waiting behind a failing head does not use up their deliveries.
-- Returns false when the lease is not the caller's; else {head entries (0 or 1), {entry or {}}...}.
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return false end
local head = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[4])
local rest = {}
for i = 5, #ARGV do
  local found = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])
  rest[#rest + 1] = found[1] or {}
end
return {head, rest}
