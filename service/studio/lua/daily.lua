-- The daily free credits: one `bonus` lot with a `grant` entry per account per
-- calendar day in Beijing, checked and granted in one step (the ledger prelude).
-- ARGV: day (YYYY-MM-DD, Beijing), amount, now epoch, now_iso, expires epoch,
--       expires_iso
local day, amount = ARGV[1], tonumber(ARGV[2])
local now_epoch, now_iso = tonumber(ARGV[3]), ARGV[4]
if redis.call('EXISTS', P) == 0 then return {'NO_ACCOUNT'} end
-- Not on the day claimed last, nor on one before it: processes whose clocks
-- disagree by a moment at midnight must not take turns granting.
local last = redis.call('HGET', P, 'daily')
if last and last >= day then return {'ALREADY_CLAIMED'} end
redis.call('HSET', P, 'daily', day)
sweep(now_epoch, now_iso)
add_lot('bonus', amount, tonumber(ARGV[5]), ARGV[6], now_iso, nil)
entry('grant', amount, now_iso, nil, nil, 'daily credits')
publish('credits', {balance = balance()})
return {'OK', balance()}
