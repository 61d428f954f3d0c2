-- An account's exports. KEYS[1] is the account hash studio:acct:{<uid>}; every
-- key derives from it (one slot). ARGV[1] = action, ARGV[2] = export id.
-- Returns {outcome, the export's fields flat (when there is one)}.
local P, action, eid = KEYS[1], ARGV[1], ARGV[2]
local INDEX, EXPORT = P .. ':exports', P .. ':export:' .. eid

if action == 'request' then
  -- ARGV: now epoch, now_iso, window (s), record ttl (s).
  -- One export per window: a pending or ready one made within it refuses.
  -- The id is drawn once per call: a retry whose first try ran (its reply
  -- lost) finds its export made, and answers it rather than TOO_SOON.
  if redis.call('EXISTS', EXPORT) == 1 then return {'OK', redis.call('HGETALL', EXPORT)} end
  if redis.call('EXISTS', P) == 0 then return {'NO_ACCOUNT'} end
  if redis.call('HEXISTS', P, 'deleting') == 1 then return {'ACCOUNT_DELETING'} end
  local now, window = tonumber(ARGV[3]), tonumber(ARGV[5])
  redis.call('ZREMRANGEBYSCORE', INDEX, '-inf', now - window)
  for _, other in ipairs(redis.call('ZRANGE', INDEX, 0, -1)) do
    local found = redis.call('HMGET', P .. ':export:' .. other, 'status', 'created')
    if found[1] == 'pending' or found[1] == 'ready' then
      return {'TOO_SOON', tonumber(found[2]) + window - now}
    end
  end
  redis.call('HSET', EXPORT, 'id', eid, 'status', 'pending',
             'created', now, 'created_at', ARGV[4])
  redis.call('EXPIRE', EXPORT, tonumber(ARGV[6]))
  redis.call('ZADD', INDEX, now, eid)
  redis.call('EXPIRE', INDEX, window)
  return {'OK', redis.call('HGETALL', EXPORT)}
end

local status = redis.call('HGET', EXPORT, 'status')

if action == 'start' then
  -- ARGV: the builder's lease token. Whoever builds last owns the outcome.
  if status ~= 'pending' then return {'GONE'} end
  redis.call('HSET', EXPORT, 'builder', ARGV[3])
  return {'OK'}
end

if action == 'ready' then
  -- ARGV: token, media key, expires epoch, expires_iso. Only the current builder.
  if status ~= 'pending' or redis.call('HGET', EXPORT, 'builder') ~= ARGV[3] then
    return {'LOST'}
  end
  redis.call('HSET', EXPORT, 'status', 'ready', 'key', ARGV[4],
             'expires', ARGV[5], 'expires_at', ARGV[6])
  redis.call('EXPIREAT', EXPORT, tonumber(ARGV[5]))
  return {'OK', redis.call('HGETALL', EXPORT)}
end

if action == 'fail' then
  -- ARGV: token, ttl (s): a failed export is shown for a while, then forgotten.
  if status ~= 'pending' or redis.call('HGET', EXPORT, 'builder') ~= ARGV[3] then
    return {'LOST'}
  end
  redis.call('HSET', EXPORT, 'status', 'failed')
  redis.call('EXPIRE', EXPORT, tonumber(ARGV[4]))
  return {'OK', redis.call('HGETALL', EXPORT)}
end
return redis.error_reply('ERR exports: unknown action')
