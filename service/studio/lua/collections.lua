-- A person's collections of their own works; KEYS[1] is the account hash
-- studio:acct:{<uid>} and every key derives from it (one slot).
-- Keys: P:cols (zset id -> creation number), P:col:<id> (hash: name,
-- created_at), P:col:<id>:works (zset work id -> adding number),
-- P:work:<wid>:cols (set of the collections a work is in; works.lua's delete
-- takes the work out of each).
-- ARGV[1] = action, then its arguments. KEYS[2], given for a delete, is the
-- call's own key in the same slot: a retry of a call whose reply was lost
-- (Redis may have run it) answers what the first try did, not NOT_FOUND.
local P, action = KEYS[1], ARGV[1]
local COLS = P .. ':cols'
local function col(id) return P .. ':col:' .. id end

if KEYS[2] and redis.call('GET', KEYS[2]) then return {'OK'} end

if action == 'create' then
  -- ARGV: id (drawn once per call: a retry finds it made), name, created_at, most
  if redis.call('ZSCORE', COLS, ARGV[2]) then return {'OK'} end
  if redis.call('ZCARD', COLS) >= tonumber(ARGV[5]) then return {'LIMIT_REACHED'} end
  redis.call('HSET', col(ARGV[2]), 'name', ARGV[3], 'created_at', ARGV[4])
  redis.call('ZADD', COLS, redis.call('HINCRBY', P, 'colseq', 1), ARGV[2])
  return {'OK'}
end

local id = ARGV[2]
if redis.call('ZSCORE', COLS, id) == false then return {'NOT_FOUND'} end

if action == 'rename' then
  -- ARGV: id, name
  redis.call('HSET', col(id), 'name', ARGV[3])
  return {'OK'}
end

if action == 'delete' then
  for _, wid in ipairs(redis.call('ZRANGE', col(id) .. ':works', 0, -1)) do
    redis.call('SREM', P .. ':work:' .. wid .. ':cols', id)
  end
  redis.call('DEL', col(id), col(id) .. ':works')
  redis.call('ZREM', COLS, id)
  if KEYS[2] then redis.call('SET', KEYS[2], 'OK', 'EX', 60) end
  return {'OK'}
end

if action == 'add' or action == 'remove' then
  -- ARGV: id, work id. Adding again keeps the first adding's place.
  local wid = ARGV[3]
  if redis.call('EXISTS', P .. ':work:' .. wid) == 0 then return {'NOT_FOUND'} end
  if action == 'add' then
    if redis.call('ZSCORE', col(id) .. ':works', wid) == false then
      redis.call('ZADD', col(id) .. ':works', redis.call('HINCRBY', P, 'colseq', 1), wid)
      redis.call('SADD', P .. ':work:' .. wid .. ':cols', id)
    end
  else
    redis.call('ZREM', col(id) .. ':works', wid)
    redis.call('SREM', P .. ':work:' .. wid .. ':cols', id)
  end
  return {'OK'}
end
return redis.error_reply('ERR collections: unknown action')
