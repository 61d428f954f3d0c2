-- GCRA form of a token bucket; N buckets of one subject, all-or-nothing; one round trip.
-- KEYS[1..N]       bucket keys; all share one hash tag, so one slot (Redis Cluster safe)
-- ARGV[1]          now in µs, ONLY in tests; production passes "" and Redis TIME is used
-- ARGV[3i-1..3i+1] bucket i: B (capacity, tokens), T (µs per token), c (cost; 0 = peek)
-- reply            {allowed, r_1, retry_1, reset_1, ..., r_N, retry_N, reset_N}
--   r = tokens left; retry = µs until this request could pass (-1 allowed, 0 this bucket
--   was fine, -2 never: c > B); reset = µs until the bucket is full again
local n = #KEYS
if n < 1 or #ARGV ~= 1 + 3 * n then return redis.error_reply('ERR rl: bad arity') end
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local B, T, C, TAT, NEW, ok = {}, {}, {}, {}, {}, true
for i = 1, n do
  local b, t, c = tonumber(ARGV[3*i-1]), tonumber(ARGV[3*i]), tonumber(ARGV[3*i+1])
  if not (b and t and c) or b < 1 or t < 1 or c < 0 then
    return redis.error_reply('ERR rl: bad arguments')
  end
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then tat = now end                       -- idle: bucket is full
  if tat > now + b * t then tat = now + b * t end       -- clock step / shrunk capacity
  B[i], T[i], C[i], TAT[i], NEW[i] = b, t, c, tat, tat + c * t
  if NEW[i] - now > b * t then ok = false end
end
local out = {ok and 1 or 0}
for i = 1, n do
  local tau, debt, retry = B[i] * T[i], TAT[i] - now, -1
  if ok then
    debt = NEW[i] - now
    if C[i] > 0 then redis.call('SET', KEYS[i], NEW[i], 'PX', math.ceil(debt / 1000)) end
  elseif NEW[i] - now <= tau then retry = 0
  elseif C[i] > B[i] then retry = -2
  else retry = NEW[i] - tau - now end
  out[#out + 1] = math.floor((tau - debt) / T[i])
  out[#out + 1] = retry
  out[#out + 1] = debt
end
return out
