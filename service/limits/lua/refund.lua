-- Give c tokens back to each bucket (a request that was charged but not served).
-- KEYS[1..N] bucket keys of one subject; ARGV[i] = T_i (µs per token), ARGV[N+1] = c.
-- The TAT moves back c*T but never before now: a refund cannot overfill a bucket.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local c = tonumber(ARGV[#KEYS + 1])
for i = 1, #KEYS do
  local tat = tonumber(redis.call('GET', KEYS[i]))
  if tat then
    tat = tat - c * tonumber(ARGV[i])
    if tat <= now then
      redis.call('DEL', KEYS[i])
    else
      redis.call('SET', KEYS[i], tat, 'PX', math.ceil((tat - now) / 1000))
    end
  end
end
return 1
