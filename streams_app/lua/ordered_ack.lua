-- Ordered mode: acknowledge only while holding the partition's lease (fencing).
-- KEYS: stream, lease. ARGV: group, token, entry ids...
-- Returns the number acknowledged, or false (nil) when the lease is not the caller's.
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return false end
return redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 3))
