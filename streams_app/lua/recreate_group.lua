-- Recreate a consumer group lost under running consumers (XGROUP DESTROY, FLUSHALL, DEL, a restart
-- without persistence), or move it forward: every consumer of the group runs this when it finds the
-- group gone, with the last entry id it read itself. The group ends at the largest of them, which is
-- where the lost group stood (XREADGROUP > hands out entries in id order, so the consumer that read
-- last read the largest id): nothing a consumer had read is delivered again, nothing after it is skipped.
-- KEYS: stream, settling marker. ARGV: group, this consumer's last read id (or the group's start: '0',
-- '$'), the settling time in ms. A group created on a stream that holds entries sets the marker for
-- the settling time, valued the largest last-read id reported; every later call raises that value.
-- While it lives, no read is trusted (see take_back_read.lua): consumers that have not yet noticed the
-- loss may hold entries they read before it, which the group must not hand out again.
-- Returns {what, first}: what is 'created', 'advanced' (the group stood before this id: moved to it)
-- or 'kept'; first is the id of the stream's first entry, or '' when it holds none.
local stream, marker, group, id, settle_ms = KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3])

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
local function report()
  if first == '' or not parse(id) then return end
  local high = redis.call('GET', marker)
  if high and not before(high, id) then return end
  if high then
    redis.pcall('SET', marker, id, 'KEEPTTL')  -- refused at maxmemory: the group is still moved forward
  end
end

if not last then
  redis.call('XGROUP', 'CREATE', stream, group, id, 'MKSTREAM')
  if first ~= '' and settle_ms > 0 then
    redis.call('SET', marker, parse(id) and id or '0-0', 'PX', settle_ms)
  end
  return {'created', first}
end
report()
if before(last, id) then
  redis.call('XGROUP', 'SETID', stream, group, id)
  return {'advanced', first}
end
return {'kept', first}
