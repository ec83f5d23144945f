-- Take over pending entries of other consumers, charging a run only to those their holder was
-- running (the run ledger, streams_app/consuming/runs.py).
--
-- A pending entry's count is its charged runs + 1 (the delivery it is on). Whoever held it either
-- had it in a running record when it stopped answering, or did not (it waited for a thread, or its
-- handler had returned and its ack was not sent yet). So its charged runs are count - 1, plus 1 only
-- if it was recorded running alone in its process (value '!' + its id: a suspect's run, alone.py).
-- Any other recorded entry is charged nothing: beside other chunks, which one killed the process is
-- not known (a neighbour may even be recorded and not yet started, or returned and not yet off the
-- record); it is handed back as a suspect, runs alone, and a death then is charged to it exactly.
-- A holder with no record keeps no ledger: count = runs.
--
-- A suspect stays one until it has run alone: claiming it writes it into the taker's own record (not
-- as alone), so should the taker die before running it alone (a killer read beside it, say), the next
-- taker finds it a suspect again instead of running it in an ordinary chunk, where a death is charged
-- to nobody and a killer would never reach max deliveries.
--
-- KEYS: stream, the taker's running record, then one running record per holder. ARGV: group, taker,
-- min idle (ms), max deliveries, mode ('claim', or 'check': change nothing), the records' TTL (ms),
-- then per holder (in KEYS order): its name, n, n ids.
-- Returns {claimed, over}: claimed = {id, fields, new count, suspect (1/0)} per entry claimed (XCLAIM
-- ... RETRYCOUNT runs + 1); over = ids whose charged runs reached max deliveries (not claimed).
-- An entry no longer pending with that holder, or not idle that long, is skipped (a racing taker won).
local stream, group, taker = KEYS[1], ARGV[1], ARGV[2]
local min_idle, max_deliveries, mode, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6]
local claimed, over, suspects = {}, {}, {}
local i, k = 7, 3
while i <= #ARGV do
  local holder, n = ARGV[i], tonumber(ARGV[i + 1])
  local marked = {}
  local record = redis.call('HGETALL', KEYS[k])
  -- No record: a holder that keeps no ledger (Redis's counts, a client outside Shoal) or whose record
  -- expired: its count is taken as runs, as Redis counts them.
  local raw = (#record == 0) and 1 or 0
  for r = 2, #record, 2 do
    local value = record[r]
    local alone = string.sub(value, 1, 1) == '!'
    if alone then value = string.sub(value, 2) end
    local ids = {}
    for id in string.gmatch(value, '[^,]+') do ids[#ids + 1] = id end
    for _, id in ipairs(ids) do marked[id] = (alone and #ids == 1) and 1 or 0 end
  end
  for j = i + 2, i + 1 + n do
    local id = ARGV[j]
    local pending = redis.call('XPENDING', stream, group, id, id, 1)
    if #pending == 1 and pending[1][2] == holder and pending[1][3] >= min_idle then
      local runs = pending[1][4] - 1 + math.max(raw, marked[id] or 0)
      if runs >= max_deliveries then
        over[#over + 1] = id
      elseif mode == 'claim' then
        local got = redis.call('XCLAIM', stream, group, taker, min_idle, id, 'RETRYCOUNT', runs + 1)
        if #got == 1 and got[1][2] then
          claimed[#claimed + 1] = {id, got[1][2], runs + 1, marked[id] and 1 or 0}
          if marked[id] then suspects[#suspects + 1] = id end
        end
      end
    end
  end
  i = i + 2 + n
  k = k + 1
end
if #suspects > 0 then
  local fields = {'-', ''}
  for _, id in ipairs(suspects) do
    fields[#fields + 1] = id
    fields[#fields + 1] = id
  end
  redis.call('HSET', KEYS[2], unpack(fields))
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return {claimed, over}
