-- An account's deletion: marked, restored, purged. KEYS[1] is the account hash
-- studio:acct:{<uid>} and every key derives from it (one slot on Redis Cluster).
-- ARGV[1] = action, then the action's own arguments.
local P, action = KEYS[1], ARGV[1]
local UNLISTED = P .. ':unlisted'

if action == 'mark' then
  -- ARGV: purge_at epoch. Marking again keeps the first purge_at.
  if redis.call('EXISTS', P) == 0 then return {'NO_ACCOUNT'} end
  local at = redis.call('HGET', P, 'deleting')
  if not at then
    at = ARGV[2]
    redis.call('HSET', P, 'deleting', at)
  end
  return {'OK', at, redis.call('HGET', P, 'email') or '', redis.call('HGET', P, 'address') or ''}
end

if action == 'restore' then
  -- ARGV: now epoch ('' = at any time before the purge began). RESUME: a
  -- restore cut short left works to put back on the square.
  local at = redis.call('HGET', P, 'deleting')
  if not at then
    if redis.call('EXISTS', UNLISTED) == 1 then return {'RESUME'} end
    return {'LIVE'}
  end
  if redis.call('HGET', P, 'purging') or (ARGV[2] ~= '' and tonumber(at) <= tonumber(ARGV[2])) then
    return {'EXPIRED'}
  end
  redis.call('HDEL', P, 'deleting')
  return {'RESTORED'}
end

if action == 'begin_purge' then
  -- ARGV: now epoch. From here on no restore wins; again is a no-op.
  if redis.call('EXISTS', P) == 0 then return {'GONE'} end
  local at = redis.call('HGET', P, 'deleting')
  if not at then return {'LIVE'} end
  if not redis.call('HGET', P, 'purging') then
    if tonumber(at) > tonumber(ARGV[2]) then return {'EARLY'} end
    redis.call('HSET', P, 'purging', ARGV[2])
  end
  return {'PURGE', redis.call('HGET', P, 'email') or '', redis.call('HGET', P, 'address') or ''}
end

if action == 'keep' then
  -- ARGV: seconds kept. The ledger keeps only the entries about an order;
  -- the orders, their refunds and those entries expire after that long.
  local LEDGER = P .. ':ledger'
  local kept = {}
  for _, raw in ipairs(redis.call('LRANGE', LEDGER, 0, -1)) do
    if cjson.decode(raw).order_id ~= cjson.null then kept[#kept + 1] = raw end
  end
  redis.call('DEL', LEDGER)
  for i = 1, #kept, 1000 do
    redis.call('RPUSH', LEDGER, unpack(kept, i, math.min(i + 999, #kept)))
  end
  local seconds = tonumber(ARGV[2])
  redis.call('EXPIRE', LEDGER, seconds)
  redis.call('EXPIRE', P .. ':orders', seconds)
  for _, oid in ipairs(redis.call('ZRANGE', P .. ':orders', 0, -1)) do
    redis.call('EXPIRE', P .. ':order:' .. oid, seconds)
    redis.call('EXPIRE', P .. ':order:' .. oid .. ':refunds', seconds)
  end
  return {'OK', #kept}
end
return redis.error_reply('ERR deletion: unknown action')
