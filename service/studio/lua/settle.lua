-- Move a generation along queued -> running -> succeeded | failed | canceled.
-- Each transition happens at most once, so a job run twice (a retry, a crash,
-- a duplicate delivery) never charges or refunds twice: the refund is part of
-- the one transition into `failed` or `canceled`.
-- ARGV: gid, action, now_iso, ack, then per action:
--   start | progress FRACTION | succeed WORKS_JSON [work id, work json]... |
--   fail ERROR | cancel [queued]
-- `ack`, if not empty, is the stream entry of the job's delivery in KEYS[2]
-- (the account's shard): a worker's transition that ends the job (or finds it
-- ended) finishes it in the same step, one round trip instead of two.
local gid, action, now_iso = ARGV[1], ARGV[2], ARGV[3]
local ack = action ~= 'progress' and KEYS[2] and ARGV[4] or ''
local key = gen_key(gid)

local function ended(reply)
  if ack ~= '' then finish_job(KEYS[2], gid, ack) end
  return reply
end

local status = redis.call('HGET', key, 'status')
if not status then return ended({'NOT_FOUND'}) end
local live = status == 'queued' or status == 'running'
-- `cancel queued` (cancel all queued) leaves a job that has started alone.
if action == 'cancel' and ARGV[5] == 'queued' and status ~= 'queued' then
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
  return ended({'FINISHED', redis.call('HGETALL', key)})
end

if action == 'progress' then
  local p = tonumber(ARGV[5])
  if status == 'running' and p > tonumber(redis.call('HGET', key, 'progress')) then
    redis.call('HSET', key, 'progress', ARGV[5])
    return {'OK', gen_event(gid)}
  end
  return {status == 'running' and 'IGNORED' or 'FINISHED'}
end

if not live then
  if action == 'cancel' then return ended({'NOT_CANCELABLE', redis.call('HGETALL', key)}) end
  return ended({'FINISHED', redis.call('HGETALL', key)})
end
redis.call('SREM', ACTIVE, gid)

if action == 'succeed' then
  redis.call('HSET', key, 'status', 'succeeded', 'progress', '1', 'finished_at', now_iso,
             'works', ARGV[5])
  for i = 6, #ARGV, 2 do
    redis.call('SET', P .. ':work:' .. ARGV[i], ARGV[i + 1])
    redis.call('ZADD', P .. ':works', redis.call('HINCRBY', P, 'wseq', 1), ARGV[i])
  end
  return ended({'OK', gen_event(gid)})
end

local new_status, err = 'canceled', nil
if action == 'fail' then new_status, err = 'failed', ARGV[5] end
redis.call('HSET', key, 'status', new_status, 'finished_at', now_iso, 'refunded', '1')
if err then redis.call('HSET', key, 'error', err) end
local amount = give_back(cjson.decode(redis.call('HGET', key, 'lots')))
entry('refund', amount, now_iso, gid, nil, nil)
publish('credits', {balance = balance()})
-- A job that ends before it started needs no worker: it leaves the queue now
-- (a worker that was just handed it finds it gone and does nothing).
if status == 'queued' and KEYS[2] then finish_job(KEYS[2], gid, '') end
return ended({'OK', gen_event(gid)})
