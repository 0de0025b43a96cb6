-- Forget one message wherever it is (checked out, back in the ready list after a
-- late acknowledgement, or dead-lettered). Returns 1 if it existed.
-- KEYS: ready, checkouts, bodies, retries, dead   ARGV: key
if redis.call('HDEL', KEYS[3], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[4], ARGV[1])
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  if redis.call('LREM', KEYS[1], 0, ARGV[1]) == 0 then
    redis.call('LREM', KEYS[5], 0, ARGV[1])
  end
end
return 1
