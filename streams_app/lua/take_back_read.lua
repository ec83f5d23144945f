-- Take back a read that handed this consumer entries at or below its own last read id: the group
-- was lost and recreated further back by another consumer before this one noticed (see
-- consuming/lost_group.py), or read while the recreated group settles (the marker of
-- recreate_group.lua lives). None of them has run here.
-- While the group settles, no read is trusted: every one is taken back, and the group goes back to
-- just before the first entry read, or to the marker's value (the largest last read id reported) if
-- that is further on. Reads taken back in any order thus leave the group where the live consumers put it.
-- Otherwise:
-- KEYS: stream, settling marker. ARGV: group, consumer, this consumer's last read id, then the ids read (in id order).
-- If nobody read after it (the group still stands at the last id read), the read is undone: the
-- entries leave this consumer's pending list and the group goes back to just before the first of
-- them, so whoever moves it forward decides what comes next, and nothing is skipped. Otherwise the
-- group moved on meanwhile and cannot go back: entries at or below the last read id (this consumer
-- read them before the loss: run or held, and a holder puts its own back) leave the pending list;
-- those above it stay pending, to be taken over after the pending timeout (run twice if another
-- consumer had read them before the loss; never skipped). Only entries still owned by this consumer
-- are touched. Returns {'undone' or 'kept', number of entries left pending}.
local stream, marker, group, consumer, mine = KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]

local function parse(entry_id)
  local ms, seq = string.match(entry_id, '^(%d+)%-(%d+)$')
  if not ms then ms, seq = string.match(entry_id, '^(%d+)$'), '0' end
  return ms, seq
end

local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

local function after(a, b)
  local ams, aseq = parse(a)
  local bms, bseq = parse(b)
  if ams ~= bms then return less(bms, ams) end
  return less(bseq, aseq)
end

local last = nil
for _, info in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local name, delivered
  for k = 1, #info, 2 do
    if info[k] == 'name' then name = info[k + 1] end
    if info[k] == 'last-delivered-id' then delivered = info[k + 1] end
  end
  if name == group then last = delivered end
end
if not last then return {'gone', 0} end

local first, newest = ARGV[4], ARGV[#ARGV]
local function previous()
  local before = redis.call('XREVRANGE', stream, '(' .. first, '-', 'COUNT', 1)
  return before[1] and before[1][1] or '0-0'
end

local high = redis.call('GET', marker)
if high then
  for i = 4, #ARGV do
    local pending = redis.call('XPENDING', stream, group, ARGV[i], ARGV[i], 1)
    if #pending == 1 and pending[1][2] == consumer then redis.call('XACK', stream, group, ARGV[i]) end
  end
  local target = previous()
  if after(target, last) then target = last end
  if after(high, target) then target = high end
  redis.call('XGROUP', 'SETID', stream, group, target)
  return {'undone', 0}
end

local undo = last == newest
local kept = 0
for i = 4, #ARGV do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', stream, group, id, id, 1)
  if #pending == 1 and pending[1][2] == consumer then
    if undo or not after(id, mine) then
      redis.call('XACK', stream, group, id)
    else
      kept = kept + 1
    end
  end
end
if undo then
  redis.call('XGROUP', 'SETID', stream, group, previous())
  return {'undone', 0}
end
return {'kept', kept}
