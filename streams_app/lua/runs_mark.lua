-- The run ledger (streams_app/consuming/runs.py): record, before chunks' handlers start, which
-- entries they run, so that whoever takes them over after this consumer died charges a run to them.
-- KEYS: the consumer's running record (keys.running_key). ARGV: the record's TTL in ms, then per chunk:
-- its field (its first id) and its ids joined by ','. One HSET for all: no per-entry command.
-- Field '-' (no ids) stays while the others come and go: a record that exists says its consumer
-- keeps a ledger (take_over_runs.lua); with no chunk, only it is written (the loop, as it starts).
redis.call('HSET', KEYS[1], '-', '', unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
