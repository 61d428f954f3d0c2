-- Finish a job; every key shares the queue's hash tag {q}. Jobs are created by
-- the submit script, in the same step that charges their generation.
-- KEYS[1] = studio:jobs:{q} (prefix). ARGV[1] = action, ARGV[2] = generation id.
local Q, action, gid = KEYS[1], ARGV[1], ARGV[2]
local job = Q .. ':job:' .. gid
if action == 'finish' then
  -- ARGV[3]: the stream entry that delivered it (also acked if the job is gone)
  local entry = redis.call('HGET', job, 'entry') or ARGV[3]
  if entry and entry ~= '' then
    redis.call('XACK', Q .. ':stream', 'workers', entry)
    redis.call('XDEL', Q .. ':stream', entry)
  end
  redis.call('ZREM', Q .. ':deadlines', gid)
  redis.call('ZREM', Q .. ':waiting', gid)
  return redis.call('DEL', job)
end
return redis.error_reply('ERR queue: unknown action')
