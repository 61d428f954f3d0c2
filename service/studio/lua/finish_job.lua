-- Acknowledge and delete a job that needs no more running. Q is its shard's
-- prefix `studio:jobs:{q}`; `entry` is the stream entry that delivered it
-- (acked also when the job's record is gone).
local function finish_job(Q, gid, entry)
  local job = Q .. ':job:' .. gid
  entry = redis.call('HGET', job, 'entry') or entry
  if entry and entry ~= '' then
    redis.call('XACK', Q .. ':stream', 'workers', entry)
    redis.call('XDEL', Q .. ':stream', entry)
  end
  redis.call('ZREM', Q .. ':deadlines', gid)
  redis.call('ZREM', Q .. ':waiting', gid)
  return redis.call('DEL', job)
end
