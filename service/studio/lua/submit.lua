-- Check, charge, record and enqueue one generation: one atomic step.
-- KEYS[2]: the prefix of the queue shard in the account's slot
-- (studio:jobs:{<tag>}, see queue.py), so this is one slot on Redis Cluster.
-- KEYS[3..]: on a single server only, every shard's line of waiting jobs: the
-- new job's place in line is counted here too (one round trip less).
-- ARGV: gid, idempotency key ('' for none), body hash, price, per-user cap,
--       now epoch, now_iso, deadline epoch, then the generation's fields as
--       field, value...
local gid, idem, body_hash = ARGV[1], ARGV[2], ARGV[3]
local price, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local now_epoch, now_iso = tonumber(ARGV[6]), ARGV[7]
local idem_key = P .. ':idem:' .. idem
-- This very call again: its client timed out on the reply and retried (gid is
-- drawn once per request). Answer as it went, and charge nothing twice.
if redis.call('EXISTS', gen_key(gid)) == 1 then
  return {'OK', redis.call('HGETALL', gen_key(gid))}
end
if idem ~= '' then
  local seen = redis.call('GET', idem_key)
  if seen then
    local record = cjson.decode(seen)
    if record.h ~= body_hash then return {'IDEMPOTENCY_KEY_REUSED'} end
    return {'REPLAY', redis.call('HGETALL', gen_key(record.g))}
  end
end
if redis.call('EXISTS', P) == 0 then return {'NO_ACCOUNT'} end
if redis.call('HEXISTS', P, 'deleting') == 1 then return {'ACCOUNT_DELETING'} end
if tonumber(redis.call('HGET', P, 'owed') or '0') > 0 then return {'PAYMENT_HOLD'} end
if redis.call('SCARD', ACTIVE) >= cap then return {'TOO_MANY_JOBS'} end
sweep(now_epoch, now_iso)
local have = balance()
if have < price then return {'INSUFFICIENT_CREDITS', have} end
local taken = take(price)
local key = gen_key(gid)
redis.call('HSET', key, 'id', gid, 'status', 'queued', 'progress', '0',
           'credits', price, 'refunded', '0', 'created_at', now_iso,
           'lots', cjson.encode(taken), 'works', '[]', 'idem', idem)
for i = 9, #ARGV, 2 do redis.call('HSET', key, ARGV[i], ARGV[i + 1]) end
redis.call('HSET', key, 'n', redis.call('HINCRBY', P, 'gseq', 1))
redis.call('ZADD', GENS, redis.call('HGET', key, 'n'), gid)
redis.call('SADD', ACTIVE, gid)
if idem ~= '' then
  redis.call('SET', idem_key, cjson.encode({h = body_hash, g = gid}), 'EX', 86400)
end
entry('debit', -price, now_iso, gid, nil, nil)
local Q, deadline = KEYS[2], ARGV[8]
local stream_entry = redis.call('XADD', Q .. ':stream', '*', 'g', gid)
redis.call('HSET', Q .. ':job:' .. gid, 'account', string.match(P, '{(.-)}'),
           'deadline', deadline, 'entry', stream_entry)
redis.call('ZADD', Q .. ':deadlines', deadline, gid)
-- Its place in line: the server's clock in microseconds, unique within the
-- shard, so every shard can count the jobs queued before it (positions.py).
local t, last = redis.call('TIME'), redis.call('ZREVRANGE', Q .. ':waiting', 0, 0, 'WITHSCORES')
local queued_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
if last[2] and queued_us <= tonumber(last[2]) then queued_us = tonumber(last[2]) + 1 end
redis.call('ZADD', Q .. ':waiting', queued_us, gid)
redis.call('HSET', key, 'queued_us', string.format('%d', queued_us))
redis.call('PUBLISH', 'studio:jobs:ready', '')  -- wakes idle workers
publish('credits', {balance = balance()})
if #KEYS < 3 then return {'OK', gen_event(gid)} end
local place, score = 1, '(' .. string.format('%d', queued_us)
for i = 3, #KEYS do place = place + redis.call('ZCOUNT', KEYS[i], '-inf', score) end
return {'OK', gen_event(gid), place}
