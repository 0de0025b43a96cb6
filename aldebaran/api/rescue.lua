-- Return checkouts whose visibility deadline has passed to the end of the ready list
-- with one more retry, or to the dead-letter list once they were received
-- max_receive_count times. Ordered by deadline, then key.
-- KEYS: ready, checkouts, retries, dead   ARGV: now_ms, max_receive_count, limit
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local dead = 0
for _, key in ipairs(expired) do
  redis.call('ZREM', KEYS[2], key)
  local retries = redis.call('HINCRBY', KEYS[3], key, 1)
  if retries >= tonumber(ARGV[2]) then
    redis.call('RPUSH', KEYS[4], key)
    dead = dead + 1
  else
    redis.call('RPUSH', KEYS[1], key)
  end
end
return {#expired, dead}
