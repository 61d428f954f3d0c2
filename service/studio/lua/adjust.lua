-- An operator's grant (a `bonus` lot) or take-back (in spending order), as `adjust`.
-- ARGV: amount (signed), note, now epoch, now_iso, expires epoch, expires_iso,
--       the largest amount, the operation's id (drawn once per call)
local amount, note = tonumber(ARGV[1]), ARGV[2]
local now_epoch, now_iso = tonumber(ARGV[3]), ARGV[4]
-- Checked before any write: a lot written and a balance refused would leave the
-- three views disagreeing (Redis does not roll a script back).
if not amount or amount == 0 or amount ~= math.floor(amount)
    or math.abs(amount) > tonumber(ARGV[7]) then
  return {'BAD_AMOUNT'}
end
if redis.call('EXISTS', P) == 0 then return {'NO_ACCOUNT'} end
-- This very call again: its client timed out on the reply and retried. The
-- last operation's id is kept on the account; nothing is granted twice.
if redis.call('HGET', P, 'adjusted') == ARGV[8] then return {'OK', balance()} end
sweep(now_epoch, now_iso)
if amount > 0 then
  add_lot('bonus', amount, tonumber(ARGV[5]), ARGV[6], now_iso, nil)
else
  if balance() + amount < 0 then return {'INSUFFICIENT_CREDITS', balance()} end
  take(-amount)
end
redis.call('HSET', P, 'adjusted', ARGV[8])
entry('adjust', amount, now_iso, nil, nil, note ~= '' and note or nil)
publish('credits', {balance = balance()})
return {'OK', balance()}
