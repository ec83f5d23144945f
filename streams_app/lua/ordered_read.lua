-- Ordered mode: read new entries of a partition only while holding its lease (fencing).
-- KEYS: stream, lease. ARGV: group, consumer, token, count.
-- Returns false when the lease is not the caller's; {1, entries} when it read some;
-- {0, id of the stream's last entry} when there is nothing new (the caller blocks on XREAD after it).
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return false end
local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[4], 'STREAMS', KEYS[1], '>')
if reply and reply[1] and #reply[1][2] > 0 then return {1, reply[1][2]} end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
return {0, last[1] and last[1][1] or '0-0'}
