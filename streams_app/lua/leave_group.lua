-- A consumer leaving its group on a clean stop: XGROUP DELCONSUMER only if it holds no pending entries.
-- KEYS: stream, the consumer's running record (streams_app/consuming/runs.py; deleted with it: it
-- holds nothing that a takeover could need). ARGV: group, consumer. Returns 1 if removed, 0 if it
-- holds entries (or was not there).
-- Checked and deleted in one script: DELCONSUMER drops the consumer's entries from the PEL, unacknowledged.
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then
  return 0
end
redis.call('DEL', KEYS[2])
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2]) == 0 and 1 or 0
