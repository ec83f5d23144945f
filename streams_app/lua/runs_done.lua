-- The run ledger (streams_app/consuming/runs.py): a chunk's handlers returned. Its field leaves the
-- consumer's running record, and each entry that failed and will be retried is charged its run at
-- once: its count becomes runs + 1 (the next delivery's), the count every pending entry not running
-- has. One script, so a death in between cannot charge the failure twice or not at all.
-- KEYS: stream, the consumer's running record. ARGV: group, consumer, the chunk's field, then per
-- failed entry: id, its new count. Entries another consumer took over meanwhile are left to it.
local stream, record, group, consumer = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
redis.call('HDEL', record, ARGV[3])
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', stream, group, id, id, 1)
  if #pending == 1 and pending[1][2] == consumer then
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'RETRYCOUNT', ARGV[i + 1], 'JUSTID')
  end
end
return 1
