-- Put dead letters back on their stream for one group, removing each from the DLQ in the same step.
-- KEYS: stream, dlq. ARGV: group, payload override ('' = keep the original), the override's
-- payload_types ('' = none), then dead-letter ids.
-- The new entry carries target_group: loops of other groups ack it without running their handler.
-- Returns, per id: the new stream id, 'missing' (not in the DLQ) or 'other-group'.
local stream, dlq = KEYS[1], KEYS[2]
local group, override, override_types = ARGV[1], ARGV[2], ARGV[3]
local drop = {origin_stream = true, origin_id = true, group = true, consumer = true, deliveries = true,
              error = true, traceback = true, failed_at = true, target_group = true, replay_of = true}
if override ~= '' then
  drop.payload = true
  drop.data = true
  drop.payload_types = true  -- the types describe the original payload, not the override
end
local result = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local entry = redis.call('XRANGE', dlq, id, id)
  if #entry == 0 then
    result[#result + 1] = 'missing'
  else
    local raw = entry[1][2]
    local info = {}
    for j = 1, #raw, 2 do
      if drop[raw[j]] then info[raw[j]] = raw[j + 1] end
    end
    if info.group ~= group then
      result[#result + 1] = 'other-group'
    else
      local fields = {}
      for j = 1, #raw, 2 do
        if not drop[raw[j]] then
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
      fields[#fields + 1] = 'target_group'
      fields[#fields + 1] = group
      fields[#fields + 1] = 'replay_of'
      fields[#fields + 1] = info.origin_id or ''
      result[#result + 1] = redis.call('XADD', stream, '*', unpack(fields))
      redis.call('XDEL', dlq, id)
    end
  end
end
return result
