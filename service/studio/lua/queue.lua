-- Finish a job; every key shares the queue's hash tag {q}. Jobs are created by
-- the submit script, in the same step that charges their generation.
-- KEYS[1] = studio:jobs:{q} (prefix). ARGV[1] = action, ARGV[2] = generation id.
local Q, action, gid = KEYS[1], ARGV[1], ARGV[2]
local job = Q .. ':job:' .. gid
if action == 'finish' then return finish_job(Q, gid, ARGV[3]) end
if action == 'take' then
  -- One more run of a job: its record, with the run counted (none if it is gone).
  -- Taken, it no longer waits: the next read's plan skips it (queue.py).
  if redis.call('EXISTS', job) == 0 then return {} end
  redis.call('HINCRBY', job, 'attempts', 1)
  redis.call('ZREM', Q .. ':waiting', gid)
  return redis.call('HGETALL', job)
end
return redis.error_reply('ERR queue: unknown action')
