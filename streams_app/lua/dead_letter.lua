-- Move pending entries of one group to the dead-letter stream: XADD to the DLQ and XACK together.
-- KEYS: stream, dlq, then one last-error key per entry.
-- ARGV: group, failed_at (ms), then per entry: id, error, traceback ('' = use the recorded last error).
-- Returns, per entry: the dead-letter id; 0 when the entry is no longer pending in the group (acked, or
-- moved by another worker or daemon first: the check makes racing movers safe); 'gone' when the entry
-- was deleted from the stream (it is acked: there is nothing left to handle or replay); or
-- 'failed:<reason>' when Redis refused the XADD (maxmemory): that entry stays pending, untouched, and
-- the others are moved all the same. The XADD comes first and the XACK only after it succeeded, so an
-- entry is never acked without its dead letter.
--
-- The dead letter keeps every original field as it was; Shoal's metadata fields are namespaced
-- ('shoal:...'), so an original field named 'group' or 'error' is never lost. An entry with more
-- fields than one Lua call can take (unpack is bounded by the C stack, about 8,000 values) keeps
-- them as one value, 'shoal:fields', a netstring list (<len>:<bytes>, per name and value).
-- Original fields under the names of that metadata (written by a producer outside Shoal, which
-- breaks the reserved prefix) are left out: with two 'shoal:group' fields, readers would take the
-- producer's, and the dead letter could be neither listed under its group nor replayed.
local stream, dlq = KEYS[1], KEYS[2]
local metadata = {['shoal:origin_stream'] = true, ['shoal:origin_id'] = true, ['shoal:group'] = true,
                  ['shoal:consumer'] = true, ['shoal:deliveries'] = true, ['shoal:error'] = true,
                  ['shoal:traceback'] = true, ['shoal:failed_at'] = true, ['shoal:fields'] = true}
local group, failed_at = ARGV[1], ARGV[2]
local MAX_INLINE = 7000  -- values (names and values) kept as fields of their own
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
        -- pcall: a last-error key of another type must not stop the move (that record is lost either way).
        local saved = redis.pcall('HMGET', err_key, 'error', 'traceback')
        if saved.err then saved = {} end
        err = saved[1] or ('no handler error recorded: delivered ' .. deliveries ..
                           ' times without an ack (the worker was killed or stuck mid-handler)')
        tb = saved[2] or ''
      end
      local fields = {'shoal:origin_stream', stream, 'shoal:origin_id', id, 'shoal:group', group,
                      'shoal:consumer', consumer, 'shoal:deliveries', tostring(deliveries), 'shoal:error', err,
                      'shoal:traceback', tb, 'shoal:failed_at', failed_at}
      local raw = entry[1][2]
      if #raw <= MAX_INLINE then
        for j = 1, #raw, 2 do
          if not metadata[raw[j]] then
            fields[#fields + 1] = raw[j]
            fields[#fields + 1] = raw[j + 1]
          end
        end
      else
        local parts = {}
        for j = 1, #raw, 2 do
          if not metadata[raw[j]] then
            parts[#parts + 1] = #raw[j] .. ':' .. raw[j] .. #raw[j + 1] .. ':' .. raw[j + 1]
          end
        end
        fields[#fields + 1] = 'shoal:fields'
        fields[#fields + 1] = table.concat(parts)
      end
      local added = redis.pcall('XADD', dlq, '*', unpack(fields))
      if type(added) == 'table' and added.err then
        result[i] = 'failed:' .. added.err
      else
        result[i] = added
        redis.call('XACK', stream, group, id)
        redis.call('DEL', err_key)
      end
    end
  end
end
return result
