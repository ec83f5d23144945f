-- On a cluster, the READY result of a tick periodic_claim.lua enqueued (another slot than the claim's):
-- written only while there is none, so a worker that already started the run (and wrote its own
-- result, streams_app/tasks/runner.py) is not set back to READY.
-- KEYS: the result hash. ARGV: ttl (s), then the fields and values.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local fields = {}
for i = 2, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
