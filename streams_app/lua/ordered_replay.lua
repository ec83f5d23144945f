-- Ordered mode: hand out again, in id order, entries pending for this consumer, while holding the lease.
-- KEYS: stream, lease. ARGV: group, consumer, token, then the ids (the failed head first).
-- Each one is claimed: a counted delivery. The caller takes the count back (undeliver.lua) for those
-- left unrun behind a failure, so waiting behind a failing head does not use up their deliveries.
-- Returns false when the lease is not the caller's; else per id the entry, or {} when it was deleted
-- from the stream (XCLAIM drops such an id from the PEL).
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return false end
local entries = {}
for i = 4, #ARGV do
  local claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i])
  entries[#entries + 1] = claimed[1] or {}
end
return entries
