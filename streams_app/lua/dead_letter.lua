-- Move pending entries of one group to the dead-letter stream: XADD to the DLQ and XACK together.
-- KEYS: stream, dlq, then one last-error key per entry.
-- ARGV: group, failed_at (ms), then per entry: id, error, traceback ('' = use the recorded last error).
-- Returns, per entry: the dead-letter id, 0 when the entry is no longer pending in the group (acked, or
-- moved by another worker or daemon first: the check makes racing movers safe), or 'gone' when the
-- entry was deleted from the stream (it is acked: there is nothing left to handle or replay).
local stream, dlq = KEYS[1], KEYS[2]
local group, failed_at = ARGV[1], ARGV[2]
local meta = {origin_stream = true, origin_id = true, group = true, consumer = true, deliveries = true,
              error = true, traceback = true, failed_at = true}
local result = {}
local count = (#ARGV - 2) / 3
for i = 1, count do
  local id, err, tb = ARGV[3 * i], ARGV[3 * i + 1], ARGV[3 * i + 2]
  local err_key = KEYS[2 + i]
  local pending = redis.call('XPENDING', stream, group, id, id, 1)
  if #pending == 0 then
    result[i] = 0
  else
    local consumer, deliveries = pending[1][2], pending[1][4]
    local entry = redis.call('XRANGE', stream, id, id)
    if #entry == 0 then
      redis.call('XACK', stream, group, id)
      redis.call('DEL', err_key)
      result[i] = 'gone'
    else
      if err == '' then
        local saved = redis.call('HMGET', err_key, 'error', 'traceback')
        err = saved[1] or ('no handler error recorded: delivered ' .. deliveries ..
                           ' times without an ack (the worker was killed or stuck mid-handler)')
        tb = saved[2] or ''
      end
      local fields = {}
      local raw = entry[1][2]
      for j = 1, #raw, 2 do
        if not meta[raw[j]] then
          fields[#fields + 1] = raw[j]
          fields[#fields + 1] = raw[j + 1]
        end
      end
      local extra = {'origin_stream', stream, 'origin_id', id, 'group', group, 'consumer', consumer,
                     'deliveries', tostring(deliveries), 'error', err, 'traceback', tb, 'failed_at', failed_at}
      for j = 1, #extra do fields[#fields + 1] = extra[j] end
      result[i] = redis.call('XADD', dlq, '*', unpack(fields))
      redis.call('XACK', stream, group, id)
      redis.call('DEL', err_key)
    end
  end
end
return result
