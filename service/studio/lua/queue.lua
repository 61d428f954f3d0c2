-- Take, finish or read jobs. Jobs are created by the submit script, in the same
-- step that charges their generation.
-- take, finish: KEYS[1] = studio:jobs:{q} (a shard's prefix; every key shares its
--   hash tag {q}). ARGV[1] = action, ARGV[2] = generation id.
-- read (one server only): KEYS = every shard's prefix, in shard order.
--   ARGV[2] = consumer, ARGV[3] = count. Reply: {shards planned, entries
--   dropped, then shard, entry, generation id of each job delivered}. An entry
--   that names no generation (hex `g`) is not a job: it is acknowledged and
--   deleted, or it would come back to some worker at every take-over.
if ARGV[1] == 'read' then
  -- The `count` jobs waiting longest over every shard's line (scored by submit
  -- time) decide how many each shard gives, so jobs start in the order they were
  -- submitted whatever their shard; then each shard's share is delivered.
  local consumer, count, heads = ARGV[2], tonumber(ARGV[3]), {}
  for i = 1, #KEYS do
    local line = redis.call('ZRANGE', KEYS[i] .. ':waiting', 0, count - 1, 'WITHSCORES')
    for j = 2, #line, 2 do heads[#heads + 1] = {tonumber(line[j]), i} end
  end
  table.sort(heads, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  local want, order = {}, {}
  for j = 1, math.min(count, #heads) do
    local i = heads[j][2]
    if not want[i] then order[#order + 1], want[i] = i, 0 end
    want[i] = want[i] + 1
  end
  local out = {#order, 0}
  for _, i in ipairs(order) do
    local stream = KEYS[i] .. ':stream'
    local got = redis.call('XREADGROUP', 'GROUP', 'workers', consumer, 'COUNT', want[i],
                           'STREAMS', stream, '>')
    for _, entry in ipairs(got and got[1][2] or {}) do
      local fields, gid = entry[2], nil  -- no fields: deleted after it was queued
      for f = 1, fields and #fields or 0, 2 do
        if fields[f] == 'g' then gid = fields[f + 1] end
      end
      if gid and string.match(gid, '^%x+$') then
        out[#out + 1], out[#out + 2], out[#out + 3] = i - 1, entry[1], gid
      elseif fields then
        redis.call('XACK', stream, 'workers', entry[1])
        redis.call('XDEL', stream, entry[1])
        out[2] = out[2] + 1
      end
    end
  end
  return out
end
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
