-- Check out up to `count` messages: pop from the ready list and record each one's
-- visibility deadline in the checkouts sorted set in the same step, so a crash can
-- never leave a message in neither place.
-- KEYS: ready, checkouts, bodies, retries   ARGV: now_ms, lifetime_ms, count
local out = {}
local deadline = tonumber(ARGV[1]) + tonumber(ARGV[2])
local wanted = tonumber(ARGV[3])
local found = 0
while found < wanted do
  local key = redis.call('LPOP', KEYS[1])
  if not key then break end
  local body = redis.call('HGET', KEYS[3], key)
  if body then
    redis.call('ZADD', KEYS[2], deadline, key)
    local retries = redis.call('HGET', KEYS[4], key) or '0'
    table.insert(out, key)
    table.insert(out, retries)
    table.insert(out, body)
    found = found + 1
  end
end
return out
