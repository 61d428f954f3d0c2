-- Many subjects' decisions in one script run: the limiter's batch of one event-loop turn.
-- Preceded by `local function gcra(KEYS, ARGV)`, gcra.lua's text and `end` (limiter.py).
-- KEYS             every call's bucket keys, call after call, then r keys to read
--                  (one slot: a cluster batch holds the calls of one slot, reads none)
-- ARGV[1]          now in µs, ONLY in tests; production passes "" and Redis TIME is used
-- ARGV[2], ARGV[3] m, the number of calls; r, the number of keys to read
-- then per call    n (its buckets), then its 3n bucket arguments as gcra.lua takes them
-- reply            {reply_1, ..., reply_m, value_1, ..., value_r}: each gcra.lua's
--                  reply (or its error), then each read key's value (nil if none)
local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local m, r = tonumber(ARGV[2]), tonumber(ARGV[3])
if not (m and r) or r < 0 then return redis.error_reply('ERR rl: bad arity') end
-- Where each call's keys and arguments start, all checked before any is decided.
local K, A, k, a = {}, {}, 1, 4
for i = 1, m do
  local n = tonumber(ARGV[a])
  if not n or n < 1 then return redis.error_reply('ERR rl: bad arity') end
  K[i], A[i], k, a = k, a, k + n, a + 1 + 3 * n
end
if k - 1 + r ~= #KEYS or a - 1 ~= #ARGV then
  return redis.error_reply('ERR rl: bad arity')
end
local out = {}
for i = 1, m do
  local n = tonumber(ARGV[A[i]])
  local keys, args = {}, {now}
  for j = 1, n do keys[j] = KEYS[K[i] + j - 1] end
  for j = 1, 3 * n do args[j + 1] = ARGV[A[i] + j] end
  out[i] = gcra(keys, args)
end
for j = 1, r do out[m + j] = redis.call('GET', KEYS[k - 1 + j]) end
return out
