-- Put dead letters back on their stream for one group, removing each from the DLQ in the same step.
-- KEYS: stream, dlq[, counter]. ARGV: group, payload override ('' = keep the original), the override's
-- payload_types ('' = none), then dead-letter ids.
-- With a counter (a hash in the stream's slot), its 'replayed' field grows by what this call replayed,
-- in the same step: a background job whose runner dies right after a batch still knows it ran.
-- The new entry carries shoal:target_group: loops of other groups ack it without running their handler.
-- Refuses with a NOGROUP error, replaying and removing nothing, when the group does not exist on the
-- stream: nobody would run the entries, and every other group would ack them unseen.
-- Returns, per id: the new stream id, 'missing' (not in the DLQ), 'other-group', or 'too-wide' (an
-- entry whose fields were packed into shoal:fields: more than one XADD from Lua can take; it stays).
local stream, dlq = KEYS[1], KEYS[2]
local group, override, override_types = ARGV[1], ARGV[2], ARGV[3]
local exists = false
if redis.call('EXISTS', stream) == 1 then
  for _, info in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    for k = 1, #info, 2 do
      if info[k] == 'name' and info[k + 1] == group then exists = true end
    end
  end
end
if not exists then
  return redis.error_reply('NOGROUP group ' .. group .. ' does not exist on ' .. stream)
end
-- Dead letters written before Shoal namespaced its fields (no shoal:origin_id) carry the old names.
local legacy_drop = {origin_stream = true, origin_id = true, group = true, consumer = true, deliveries = true,
                     error = true, traceback = true, failed_at = true, target_group = true, replay_of = true}
local drop = {['shoal:origin_stream'] = true, ['shoal:origin_id'] = true, ['shoal:group'] = true,
              ['shoal:consumer'] = true, ['shoal:deliveries'] = true, ['shoal:error'] = true,
              ['shoal:traceback'] = true, ['shoal:failed_at'] = true, ['shoal:target_group'] = true,
              ['shoal:replay_of'] = true, ['shoal:fields'] = true}
if override ~= '' then
  drop.payload = true
  drop.data = true
  drop.payload_types = true  -- the types describe the original payload, not the override
end
local result = {}
local replayed = 0
for i = 4, #ARGV do
  local id = ARGV[i]
  local entry = redis.call('XRANGE', dlq, id, id)
  if #entry == 0 then
    result[#result + 1] = 'missing'
  else
    local raw = entry[1][2]
    local info = {}
    local skip = drop
    for j = 1, #raw, 2 do
      if drop[raw[j]] then info[raw[j]] = raw[j + 1] end
    end
    if not info['shoal:origin_id'] then
      skip = {}
      for k, v in pairs(legacy_drop) do skip[k] = v end
      if override ~= '' then skip.payload = true; skip.data = true; skip.payload_types = true end
      for j = 1, #raw, 2 do
        if skip[raw[j]] then info['shoal:' .. raw[j]] = raw[j + 1] end
      end
    end
    if info['shoal:group'] ~= group then
      result[#result + 1] = 'other-group'
    elseif info['shoal:fields'] then
      result[#result + 1] = 'too-wide'
    else
      local fields = {}
      for j = 1, #raw, 2 do
        if not skip[raw[j]] then
          fields[#fields + 1] = raw[j]
          fields[#fields + 1] = raw[j + 1]
        end
      end
      if override ~= '' then
        fields[#fields + 1] = 'payload'
        fields[#fields + 1] = override
        if override_types ~= '' then
          fields[#fields + 1] = 'payload_types'
          fields[#fields + 1] = override_types
        end
      end
      fields[#fields + 1] = 'shoal:target_group'
      fields[#fields + 1] = group
      fields[#fields + 1] = 'shoal:replay_of'
      fields[#fields + 1] = info['shoal:origin_id'] or ''
      result[#result + 1] = redis.call('XADD', stream, '*', unpack(fields))
      redis.call('XDEL', dlq, id)
      replayed = replayed + 1
    end
  end
end
if KEYS[3] and replayed > 0 then
  redis.call('HINCRBY', KEYS[3], 'replayed', replayed)
end
return result
