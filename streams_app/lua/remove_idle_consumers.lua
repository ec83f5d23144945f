-- Remove consumers of one group that hold no pending entries and have been idle at least ARGV[2] ms,
-- and their running records (streams_app/consuming/runs.py: they name nothing pending; without this
-- each process start left one for a week). KEYS: stream. ARGV: group, min idle (ms), the records' key
-- prefix (keys.running_key with no consumer: the stream's hash tag, so the same slot). Returns the names removed.
-- Checked and deleted in one script: a consumer cannot read an entry between the check and the
-- XGROUP DELCONSUMER (which would drop that entry from the PEL, unacknowledged), nor claim one into its
-- record before the record goes. A live consumer writes its record again before anything of it runs.
local removed = {}
local min_idle = tonumber(ARGV[2])
for _, info in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local c = {}
  for j = 1, #info, 2 do c[info[j]] = info[j + 1] end
  if c.pending == 0 and c.idle >= min_idle then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], c.name)
    if ARGV[3] then redis.call('DEL', ARGV[3] .. c.name) end
    removed[#removed + 1] = c.name
  end
end
return removed
