-- Enqueue messages in one step, each all or nothing: body + ready list, and (optionally) the
-- sender's idempotency record; a repeat of a dedup id enqueues nothing and answers the first
-- key. The retry count has no entry until the message first comes back (rescue.lua).
-- KEYS: ready, bodies, then per message its dedup record (any key when it has none)
-- ARGV: dedup_ttl_seconds, then per message: key, body, "1" when it has a dedup record
-- Returns a string with one flag per message ("1" created, "0" a repeat), then the first key of
-- each repeat in order: the sender knows the keys it created, so they do not travel back.
local flags, repeats, created = {}, {}, {}
for i = 3, #KEYS do
  local n = (i - 3) * 3 + 2
  local key, body, dedup = ARGV[n], ARGV[n + 1], ARGV[n + 2] == '1'
  -- One command checks and takes the dedup id (GET then SET cost one more per message).
  local existing = dedup and redis.call('SET', KEYS[i], key, 'NX', 'GET', 'EX', ARGV[1])
  if existing then
    flags[#flags + 1] = '0'
    repeats[#repeats + 1] = existing
  else
    redis.call('HSET', KEYS[2], key, body)
    created[#created + 1] = key
    flags[#flags + 1] = '1'
  end
end
for start = 1, #created, 1000 do  -- one RPUSH per thousand keys (unpack's stack is bounded)
  redis.call('RPUSH', KEYS[1], unpack(created, start, math.min(start + 999, #created)))
end
table.insert(repeats, 1, table.concat(flags))
return repeats
