-- Move the due deferred messages of one stream onto it (streams_app/publishing/scheduled.py).
-- KEYS: the stream, its scheduled set ({S}:scheduled), its scheduled data ({S}:scheduled:data).
-- ARGV: the most messages to move, the most bytes of fields to move (at least one message moves).
-- Due means a score at or below this server's clock (TIME), so movers on skewed hosts agree. In
-- score order (ties: scheduled id order, which is publish order within a process), each message is
-- XADDed with its fields plus shoal:scheduled_id and shoal:run_after (its due ms), then removed from
-- the set and the data hash: one script, so a mover killed at any point moved it once or not at all.
-- An XADD Redis refuses (maxmemory, the stream key of another type) stops the pass and leaves that
-- message and the rest scheduled. A member without data (its hash field deleted by hand) is dropped.
-- Returns {moved, ms until the next one is due (-1: none left; 0: due now), refusal or '', dropped}.
local stream, scheduled, data = KEYS[1], KEYS[2], KEYS[3]
-- Nothing scheduled, the usual case of an idle stream polled every SCHEDULED_POLL_INTERVAL: one command.
if redis.call('ZCARD', scheduled) == 0 then
  return {0, -1, '', 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local most_bytes = tonumber(ARGV[2])
local due = redis.call('ZRANGEBYSCORE', scheduled, '-inf', string.format('%.0f', now), 'WITHSCORES',
                       'LIMIT', 0, tonumber(ARGV[1]))

local function netstrings(packed)
  local out, pos = {}, 1
  while pos <= #packed do
    local colon = string.find(packed, ':', pos, true)
    local length = tonumber(string.sub(packed, pos, colon - 1))
    out[#out + 1] = string.sub(packed, colon + 1, colon + length)
    pos = colon + length + 1
  end
  return out
end

local moved, dropped, bytes, refusal = 0, 0, 0, ''
for i = 1, #due, 2 do
  local id, score = due[i], string.format('%.0f', tonumber(due[i + 1]))
  local packed = redis.call('HGET', data, id)
  if packed then
    local parts = netstrings(packed)
    local args = {stream}
    if parts[1] ~= '' then
      args[#args + 1] = 'MAXLEN'
      args[#args + 1] = '~'
      args[#args + 1] = parts[1]
    end
    args[#args + 1] = '*'
    for j = 2, #parts do
      args[#args + 1] = parts[j]
    end
    args[#args + 1] = 'shoal:scheduled_id'
    args[#args + 1] = id
    args[#args + 1] = 'shoal:run_after'
    args[#args + 1] = score
    local added = redis.pcall('XADD', unpack(args))
    if type(added) == 'table' and added.err then
      refusal = added.err
      break
    end
    moved = moved + 1
    bytes = bytes + #packed
  else
    dropped = dropped + 1
  end
  redis.call('ZREM', scheduled, id)
  redis.call('HDEL', data, id)
  if bytes >= most_bytes then
    break
  end
end

local next_in = -1
local head = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
if #head > 0 then
  next_in = math.max(0, tonumber(head[2]) - now)
end
return {moved, next_in, refusal, dropped}
