-- Move a generation along queued -> running -> succeeded | failed | canceled.
-- Each transition happens at most once, so a job run twice (a retry, a crash,
-- a duplicate delivery) never charges or refunds twice: the refund is part of
-- the one transition into `failed` or `canceled`.
-- ARGV: gid, action, now_iso, then per action:
--   start | progress FRACTION | succeed WORKS_JSON [work id, work json]... |
--   fail ERROR | cancel
local gid, action, now_iso = ARGV[1], ARGV[2], ARGV[3]
local key = gen_key(gid)
local status = redis.call('HGET', key, 'status')
if not status then return {'NOT_FOUND'} end
local live = status == 'queued' or status == 'running'
-- `cancel queued` (cancel all queued) leaves a job that has started alone.
if action == 'cancel' and ARGV[4] == 'queued' and status ~= 'queued' then
  return {'NOT_CANCELABLE', redis.call('HGETALL', key)}
end
-- A job leaving the line (KEYS[2]: its queue shard) no longer counts ahead of others.
if KEYS[2] and status == 'queued' and action ~= 'progress' then
  redis.call('ZREM', KEYS[2] .. ':waiting', gid)
end

if action == 'start' then
  if status == 'queued' then
    redis.call('HSET', key, 'status', 'running', 'started_at', now_iso)
    return {'STARTED', gen_event(gid)}
  end
  if status == 'running' then return {'RESUMED', redis.call('HGETALL', key)} end
  return {'FINISHED', redis.call('HGETALL', key)}
end

if action == 'progress' then
  local p = tonumber(ARGV[4])
  if status == 'running' and p > tonumber(redis.call('HGET', key, 'progress')) then
    redis.call('HSET', key, 'progress', ARGV[4])
    return {'OK', gen_event(gid)}
  end
  return {status == 'running' and 'IGNORED' or 'FINISHED'}
end

if not live then
  if action == 'cancel' then return {'NOT_CANCELABLE', redis.call('HGETALL', key)} end
  return {'FINISHED', redis.call('HGETALL', key)}
end
redis.call('SREM', ACTIVE, gid)

if action == 'succeed' then
  redis.call('HSET', key, 'status', 'succeeded', 'progress', '1', 'finished_at', now_iso,
             'works', ARGV[4])
  for i = 5, #ARGV, 2 do
    redis.call('SET', P .. ':work:' .. ARGV[i], ARGV[i + 1])
    redis.call('ZADD', P .. ':works', redis.call('HINCRBY', P, 'wseq', 1), ARGV[i])
  end
  return {'OK', gen_event(gid)}
end

local new_status, err = 'canceled', nil
if action == 'fail' then new_status, err = 'failed', ARGV[4] end
redis.call('HSET', key, 'status', new_status, 'finished_at', now_iso, 'refunded', '1')
if err then redis.call('HSET', key, 'error', err) end
local amount = give_back(cjson.decode(redis.call('HGET', key, 'lots')))
entry('refund', amount, now_iso, gid, nil, nil)
publish('credits', {balance = balance()})
return {'OK', gen_event(gid)}
