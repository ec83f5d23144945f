-- Undo task_started_many.lua for the results of a chunk whose tasks did not run (the chunk ran out of
-- its time budget: the consumer hands them back, to run in a later chunk). KEYS: the results' hashes.
-- ARGV: worker id, then the attempt number of each key. Only an attempt that is still the latest and
-- this worker's is taken back (its worker.<n>, the count, RUNNING back to READY, the first start's
-- times); an attempt another worker started since stays as it is.
for i, key in ipairs(KEYS) do
  local attempt = ARGV[1 + i]
  if redis.call('HGET', key, 'attempts') == attempt and redis.call('HGET', key, 'worker.' .. attempt) == ARGV[1] then
    redis.call('HDEL', key, 'worker.' .. attempt)
    redis.call('HINCRBY', key, 'attempts', -1)
    if attempt == '1' then
      redis.call('HDEL', key, 'started_at', 'last_attempted_at')
    end
    if redis.call('HGET', key, 'status') == 'RUNNING' then
      redis.call('HSET', key, 'status', 'READY')
    end
  end
end
return #KEYS
