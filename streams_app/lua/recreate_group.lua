-- Recreate a consumer group lost under running consumers (XGROUP DESTROY, FLUSHALL, DEL, a restart
-- without persistence), or move it forward: every consumer of the group runs this when it finds the
-- group gone, with the last entry id it read itself. The group ends at the largest of them, which is
-- where the lost group stood (XREADGROUP > hands out entries in id order, so the consumer that read
-- last read the largest id): nothing a consumer had read is delivered again, nothing after it is skipped.
-- KEYS: stream. ARGV: group, this consumer's last read id (or the group's start: '0', '$').
-- Returns {what, first}: what is 'created', 'advanced' (the group stood before this id: moved to it)
-- or 'kept'; first is the id of the stream's first entry, or '' when it holds none.
local stream, group, id = KEYS[1], ARGV[1], ARGV[2]

local function parse(entry_id)
  local ms, seq = string.match(entry_id, '^(%d+)%-(%d+)$')
  if not ms then ms, seq = string.match(entry_id, '^(%d+)$'), '0' end
  return ms, seq
end

-- Ids as text: milliseconds may pass 2^53, so compare digit strings (length, then lexically).
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

local function before(a, b)
  local ams, aseq = parse(a)
  local bms, bseq = parse(b)
  if not ams or not bms then return false end
  if ams ~= bms then return less(ams, bms) end
  return less(aseq, bseq)
end

local head = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)
local first = head[1] and head[1][1] or ''
local last = nil
if redis.call('EXISTS', stream) == 1 then
  for _, info in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local name, delivered
    for k = 1, #info, 2 do
      if info[k] == 'name' then name = info[k + 1] end
      if info[k] == 'last-delivered-id' then delivered = info[k + 1] end
    end
    if name == group then last = delivered end
  end
end
if not last then
  redis.call('XGROUP', 'CREATE', stream, group, id, 'MKSTREAM')
  return {'created', first}
end
if before(last, id) then
  redis.call('XGROUP', 'SETID', stream, group, id)
  return {'advanced', first}
end
return {'kept', first}
