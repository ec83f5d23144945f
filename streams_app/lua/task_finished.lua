-- A task attempt ends (streams_app/tasks/results.finished): one round trip instead of an HINCRBY
-- and a MULTI. KEYS: the result's hash. ARGV: ttl in seconds, the error (JSON, "" for none), then
-- field/value pairs to set (status, finished_at, return_value).
-- An error is numbered by HINCRBY and written to its own field error.<n>, so two workers' failures
-- of the same task both stay in the list.
-- Returns the hash after the write (HGETALL's flat list), or nil, writing nothing, when there is no
-- result (expired, or Redis lost its data mid-task): a half-filled hash nobody can read is worse.
local key, ttl, err = KEYS[1], ARGV[1], ARGV[2]
if redis.call('HEXISTS', key, 'task') == 0 then
  return false
end
local fields = {}
for i = 3, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
if err ~= '' then
  local number = redis.call('HINCRBY', key, 'errors', 1)
  fields[#fields + 1] = 'error.' .. number
  fields[#fields + 1] = err
end
redis.call('HSET', key, unpack(fields))
redis.call('EXPIRE', key, ttl)
return redis.call('HGETALL', key)
