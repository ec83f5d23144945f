-- The run ledger (streams_app/consuming/runs.py): record, before a chunk's handlers start, which
-- entries it runs, so that whoever takes them over after this consumer died charges a run to them.
-- KEYS: the consumer's running record (keys.running_key). ARGV: the chunk's field (its first id), the
-- chunk's ids joined by ',', the record's TTL in ms. One HSET per chunk: no per-entry command.
-- Field '-' (no ids) stays while the others come and go: a record that exists says its consumer
-- keeps a ledger (take_over_runs.lua). ARGV[1] '-' writes only it (the loop, as it starts).
redis.call('HSET', KEYS[1], '-', '', ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
