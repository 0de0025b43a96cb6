-- Enqueue one message: body + retry count + ready list, and (optionally) the
-- sender's idempotency record, all or nothing.
-- KEYS: ready, bodies, retries, [dedup]   ARGV: key, body, dedup_ttl_seconds
if KEYS[4] then
  local existing = redis.call('GET', KEYS[4])
  if existing then return {0, existing} end
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], 0)
redis.call('RPUSH', KEYS[1], ARGV[1])
if KEYS[4] then redis.call('SET', KEYS[4], ARGV[1], 'EX', ARGV[3]) end
return {1, ARGV[1]}
