-- Enqueues of tasks (streams_app/tasks/sending.py): the READY results, their index entries and the
-- messages of a batch, in one round trip instead of a MULTI of four or five commands per task (the
-- MULTI's replies were most of an enqueue's cost).
-- KEYS: the batch's streams (s of them), then its queues' result indexes, then one result hash per task.
-- ARGV: ttl (s), now (ms), '1' to also drop index ids older than ttl and push the
-- indexes' expiry back, s, the number of streams and indexes, h and the h names of the hash's fields
-- (the same for every task: sent once), then per task: its stream's and its index's position in
-- KEYS, its result id, its index score (its enqueued_at in ms, with the µs: the index orders the
-- batch's results as they were enqueued), the h values of its hash, m and the message's m values.
-- Every stream and index is checked before the first write: one of another type (WRONGTYPE) refuses
-- the whole batch with nothing written.
-- Returns the entry ids, in order.
local ttl, now, trim = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local streams, shared = tonumber(ARGV[4]), tonumber(ARGV[5])
for i = 1, shared do
  local found = redis.call('TYPE', KEYS[i]).ok
  local wanted = i <= streams and 'stream' or 'zset'
  if found ~= 'none' and found ~= wanted then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' holds a ' .. found .. ', not a ' .. wanted)
  end
end
local h = tonumber(ARGV[6])
local hash = {}
local ids, at = {}, 7 + h
local result = shared
while at <= #ARGV do
  result = result + 1
  local stream, index, id = KEYS[tonumber(ARGV[at])], KEYS[tonumber(ARGV[at + 1])], ARGV[at + 2]
  for i = 1, h do
    hash[2 * i - 1], hash[2 * i] = ARGV[6 + i], ARGV[at + 3 + i]
  end
  redis.call('HSET', KEYS[result], unpack(hash))
  redis.call('EXPIRE', KEYS[result], ttl)
  redis.call('ZADD', index, ARGV[at + 3], id)
  at = at + 4 + h
  local m = tonumber(ARGV[at])
  ids[#ids + 1] = redis.call('XADD', stream, '*', unpack(ARGV, at + 1, at + m))
  at = at + 1 + m
end
if trim then
  for i = streams + 1, shared do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - tonumber(ttl) * 1000)
    redis.call('EXPIRE', KEYS[i], ttl)
  end
end
return ids
