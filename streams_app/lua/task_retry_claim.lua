-- KEYS[1] = a task result's hash. ARGV[1] = what to hold until the new result's id is known.
-- Claims the one retry the admin makes of a failed result: returns '' when claimed now, what the
-- result already holds (the new result's id, or ARGV[1] while that retry is under way) when it was
-- retried before, false when the result is gone. One script: two submits of the same confirmation
-- cannot both claim it, and an expired result is not recreated without its TTL.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local held = redis.call('HGET', KEYS[1], 'retried_as')
if held then
  return held
end
redis.call('HSET', KEYS[1], 'retried_as', ARGV[1])
return ''
