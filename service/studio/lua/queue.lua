-- The job queue's state changes; every key shares the queue's hash tag {q}.
-- KEYS[1] = studio:jobs:{q} (prefix). ARGV[1] = action, ARGV[2] = generation id.
-- A job is reserved before its generation is charged and committed after, so a
-- crash between the two leaves a reservation the janitor settles: committed if
-- the generation exists, dropped if it never came to be.
local Q, action, gid = KEYS[1], ARGV[1], ARGV[2]
local job = Q .. ':job:' .. gid
if action == 'reserve' then
  -- ARGV: account id, deadline epoch, now epoch
  redis.call('HSET', job, 'account', ARGV[3], 'deadline', ARGV[4], 'state', 'reserved')
  redis.call('ZADD', Q .. ':reserved', ARGV[5], gid)
  return 1
end
if action == 'commit' then
  if redis.call('HGET', job, 'state') ~= 'reserved' then return false end
  local entry = redis.call('XADD', Q .. ':stream', '*', 'g', gid)
  redis.call('HSET', job, 'state', 'queued', 'entry', entry)
  redis.call('ZREM', Q .. ':reserved', gid)
  redis.call('ZADD', Q .. ':deadlines', redis.call('HGET', job, 'deadline'), gid)
  return entry
end
if action == 'drop' then
  if redis.call('HGET', job, 'state') ~= 'reserved' then return 0 end
  redis.call('ZREM', Q .. ':reserved', gid)
  return redis.call('DEL', job)
end
if action == 'finish' then
  -- ARGV[3]: the stream entry that delivered it (also acked if the job is gone)
  local entry = redis.call('HGET', job, 'entry') or ARGV[3]
  if entry and entry ~= '' then
    redis.call('XACK', Q .. ':stream', 'workers', entry)
    redis.call('XDEL', Q .. ':stream', entry)
  end
  redis.call('ZREM', Q .. ':deadlines', gid)
  redis.call('ZREM', Q .. ':reserved', gid)
  return redis.call('DEL', job)
end
return redis.error_reply('ERR queue: unknown action')
