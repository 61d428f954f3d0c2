-- A semaphore on one key: a ZSET of holders scored by when their lease ends
-- (server time, ms). Expired holders are dropped first, so a dead worker's
-- slot comes back once its lease has passed.
-- KEYS[1] the upstream's slots; ARGV: action (take | renew | give), holder,
-- limit, lease in ms. take and renew answer 1 when the holder has a slot.
local key, action, holder = KEYS[1], ARGV[1], ARGV[2]
if action == 'give' then
  return redis.call('ZREM', key, holder)
end
local limit, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local held = redis.call('ZSCORE', key, holder)
-- A renewal whose lease already ran out takes a slot again only if one is free.
if held or redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, now + lease, holder)
  redis.call('PEXPIRE', key, lease * 2)
  return 1
end
return 0
