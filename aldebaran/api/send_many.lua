-- Enqueue messages in one step, each all or nothing: body + ready list, and (optionally) the
-- sender's idempotency record; a repeat of a dedup id enqueues nothing and answers the first
-- key. The retry count has no entry until the message first comes back (rescue.lua).
-- KEYS: ready, bodies, then per message its dedup record (any key when it has none)
-- ARGV: dedup_ttl_seconds, then per message: key, body, "1" when it has a dedup record
-- Returns per message: created (1/0), key
local out = {}
for i = 3, #KEYS do
  local n = (i - 3) * 3 + 2
  local key, body, dedup = ARGV[n], ARGV[n + 1], ARGV[n + 2] == '1'
  -- One command checks and takes the dedup id (GET then SET cost one more per message).
  local existing = dedup and redis.call('SET', KEYS[i], key, 'NX', 'GET', 'EX', ARGV[1])
  if existing then
    out[#out + 1] = 0
    out[#out + 1] = existing
  else
    redis.call('HSET', KEYS[2], key, body)
    redis.call('RPUSH', KEYS[1], key)
    out[#out + 1] = 1
    out[#out + 1] = key
  end
end
return out
