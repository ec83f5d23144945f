-- Reset the idle time of entries a live consumer is handling or has queued, so that nobody who
-- judges idleness (other consumers' takeover, the reclaim daemon's audit) reads them as abandoned.
-- KEYS: stream, then (redis-guarded groups only) one idempotency mark key per entry.
-- ARGV: group, consumer, mark ttl in ms (0 = no marks), then the entry ids.
-- Only entries still owned by this consumer are touched: one another consumer took over meanwhile
-- (this one was frozen past the pending timeout) is not claimed back. XCLAIM ... JUSTID resets the
-- idle time without counting a delivery; it is allowed at maxmemory (it frees nothing, adds nothing).
-- A redis-guard mark is renewed while it still names this consumer and entry.
-- Returns the number of entries kept alive.
local stream, group, consumer, mark_ttl = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local kept = 0
for i = 4, #ARGV do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', stream, group, id, id, 1)
  if #pending == 1 and pending[1][2] == consumer then
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
    kept = kept + 1
  end
  -- The mark is renewed even if another consumer claimed the entry meanwhile: this one is still
  -- running it, and the mark is what keeps the other from running it a second time next to it.
  if mark_ttl > 0 then
    local key = KEYS[i - 2]
    if redis.call('GET', key) == 'running:' .. consumer .. ':' .. id then
      redis.call('PEXPIRE', key, mark_ttl)
    end
  end
end
return kept
