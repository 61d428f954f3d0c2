-- The export jobs of every account: a sorted set of "<account>/<export>" scored
-- by when each may next be claimed, and the lease token of whoever holds it.
-- KEYS[1] = the queue, KEYS[2] = the leases (one hash tag: one slot).
-- ARGV[1] = action. Times are the Redis server's, so workers' clocks never matter.
local QUEUE, LEASES, action = KEYS[1], KEYS[2], ARGV[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6

if action == 'claim' then
  -- ARGV: lease seconds, token. The first due job, leased to the caller.
  local due = redis.call('ZRANGEBYSCORE', QUEUE, '-inf', now, 'LIMIT', 0, 1)
  if #due == 0 then return false end
  redis.call('ZADD', QUEUE, now + tonumber(ARGV[2]), due[1])
  redis.call('HSET', LEASES, due[1], ARGV[3])
  return due[1]
end

-- The other actions: ARGV[2] = job, ARGV[3] = token; only the lease's holder acts.
local job, token = ARGV[2], ARGV[3]
if redis.call('HGET', LEASES, job) ~= token then return 0 end

if action == 'renew' then
  -- ARGV: lease seconds.
  redis.call('ZADD', QUEUE, 'XX', now + tonumber(ARGV[4]), job)
  return 1
end

if action == 'hand_back' then
  -- Due again at once: another worker takes it up.
  redis.call('ZADD', QUEUE, 'XX', now, job)
  redis.call('HDEL', LEASES, job)
  return 1
end

if action == 'done' then
  redis.call('ZREM', QUEUE, job)
  redis.call('HDEL', LEASES, job)
  return 1
end
return redis.error_reply('ERR jobs: unknown action')
