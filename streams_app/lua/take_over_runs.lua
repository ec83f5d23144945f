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
-- KEYS: stream, then one running record per holder. ARGV: group, taker, min idle (ms), max
-- deliveries, mode ('claim', or 'check': change nothing), then per holder (in KEYS order): its name,
-- n, n ids.
-- Returns {claimed, over}: claimed = {id, fields, new count, suspect (1/0)} per entry claimed (XCLAIM
-- ... RETRYCOUNT runs + 1); over = ids whose charged runs reached max deliveries (not claimed).
-- An entry no longer pending with that holder, or not idle that long, is skipped (a racing taker won).
local stream, group, taker = KEYS[1], ARGV[1], ARGV[2]
local min_idle, max_deliveries, mode = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local claimed, over = {}, {}
local i, k = 6, 2
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
        end
      end
    end
  end
  i = i + 2 + n
  k = k + 1
end
return {claimed, over}
