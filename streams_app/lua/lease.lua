-- A partition lease of ordered mode (streams_app/consuming/leases.py): acquire, renew or release.
-- KEYS: the lease key ({S:i}:lease:<group>). ARGV: token, ttl ms (0: release).
-- Returns 1 when the caller holds the lease afterwards (acquired or renewed), else 0.
-- The TTL runs on the Redis clock: a holder that stops renewing loses the lease when it lapses.
local current = redis.call('GET', KEYS[1])
if ARGV[2] == '0' then
  if current == ARGV[1] then redis.call('DEL', KEYS[1]) end
  return 0
end
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if current then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
