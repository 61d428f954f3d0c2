-- An account's orders: created, paid exactly once, expired, refunded. Runs after
-- the ledger prelude, so every move of credits keeps its invariants (balance =
-- entries = lots, never below zero). KEYS[1] = P; every key derives from it.
-- ARGV[1] = action, ARGV[2] = order id, then the action's own arguments.
local action, oid = ARGV[1], ARGV[2]
local ORDER = P .. ':order:' .. oid

local function field(name) return redis.call('HGET', ORDER, name) end
local function number(name) return tonumber(field(name)) end

-- Publish the order's fields (the SSE handler renders them) and return them flat.
local function order_event()
  local flat = redis.call('HGETALL', ORDER)
  local fields = {}
  for i = 1, #flat, 2 do fields[flat[i]] = flat[i + 1] end
  publish('order', fields)
  return flat
end

-- Take up to n credits from one lot; return how many it gave.
local function take_from_lot(id, n)
  local lot = load_lot(id)
  local k = math.min(lot.remaining, n)
  if k > 0 then
    lot.remaining = lot.remaining - k
    save_lot(id, lot)
    redis.call('HINCRBY', P, 'balance', -k)
  end
  return k
end

if action == 'create' then
  -- ARGV: idempotency key ('' for none), body hash, the call's token (drawn once
  -- per create), then the order's fields as field, value...
  local idem, body_hash, call = ARGV[3], ARGV[4], ARGV[5]
  -- This very call again: its client timed out on the reply and retried.
  if field('call') == call then return {'OK', redis.call('HGETALL', ORDER)} end
  local idem_key = P .. ':idem:order:' .. idem
  if idem ~= '' then
    local seen = redis.call('GET', idem_key)
    if seen then
      local record = cjson.decode(seen)
      if record.h ~= body_hash then return {'IDEMPOTENCY_KEY_REUSED'} end
      return {'REPLAY', redis.call('HGETALL', P .. ':order:' .. record.o)}
    end
  end
  if redis.call('EXISTS', P) == 0 then return {'NO_ACCOUNT'} end
  if redis.call('HEXISTS', P, 'deleting') == 1 then return {'ACCOUNT_DELETING'} end
  if redis.call('EXISTS', ORDER) == 1 then return {'TAKEN'} end
  local n = redis.call('HINCRBY', P, 'oseq', 1)
  redis.call('HSET', ORDER, 'id', oid, 'n', n, 'status', 'created', 'paid_at', '', 'paid', '',
             'trade_no', '', 'lot', '', 'refunded_fen', 0, 'covered_fen', 0, 'refund_id', '',
             'refund_fen', 0, 'refund_fee', 0, 'refund_credits', 0, 'refund_state', '', 'asked', 0,
             'call', call)
  for i = 6, #ARGV, 2 do redis.call('HSET', ORDER, ARGV[i], ARGV[i + 1]) end
  redis.call('ZADD', P .. ':orders', n, oid)
  if idem ~= '' then
    redis.call('SET', idem_key, cjson.encode({h = body_hash, o = oid}), 'EX', 86400)
  end
  return {'OK', order_event()}
end

local status = field('status')
if not status then return {'UNKNOWN'} end

-- A purged account keeps its orders (3 years) but has no balance or lots left
-- to move: a late payment or refund must not bring a bare account back.
if (action == 'pay' or action == 'begin_refund' or action == 'provider_refund')
    and redis.call('EXISTS', P) == 0 then
  return {'NO_ACCOUNT'}
end

if action == 'asked' then
  -- ARGV: now epoch, every (s). At most one provider query per `every` seconds.
  if tonumber(ARGV[3]) - (number('asked') or 0) < tonumber(ARGV[4]) then return {'RECENT'} end
  redis.call('HSET', ORDER, 'asked', ARGV[3])
  return {'OK'}
end

if action == 'keep_action' then
  -- ARGV: the provider's action as JSON, kept so the page can show a QR code again.
  redis.call('HSET', ORDER, 'action', ARGV[3])
  return {'OK'}
end

if action == 'expire' then
  -- ARGV: now epoch. Only a `created` order past its expiry; a late payment still credits it.
  if status ~= 'created' or tonumber(ARGV[3]) < number('expires') then return {'KEPT'} end
  redis.call('HSET', ORDER, 'status', 'expired')
  return {'EXPIRED', order_event()}
end

if action == 'pay' then
  -- ARGV: trade_no, paid fen, now epoch, now_iso, lot expires epoch, lot expires_iso.
  -- The one transition created|expired -> paid: a resend, a race or the
  -- reconciler finds the order paid and changes nothing.
  if tonumber(ARGV[4]) ~= number('fen') then return {'MISMATCH'} end
  if status ~= 'created' and status ~= 'expired' then return {'ALREADY'} end
  local now_epoch, now_iso = tonumber(ARGV[5]), ARGV[6]
  sweep(now_epoch, now_iso)
  local amount = number('credits') + number('bonus')
  local lot = add_lot('purchase', amount, tonumber(ARGV[7]), ARGV[8], now_iso, oid)
  entry('purchase', amount, now_iso, nil, oid, nil)
  redis.call('HSET', ORDER, 'status', 'paid', 'paid_at', now_iso, 'paid', now_epoch,
             'trade_no', ARGV[3], 'lot', lot)
  -- Credits owed (a provider refund of spent credits) are settled first.
  local settle = math.min(tonumber(redis.call('HGET', P, 'owed') or '0'), balance())
  if settle > 0 then
    take(settle)
    redis.call('HINCRBY', P, 'owed', -settle)
    entry('adjust', -settle, now_iso, nil, oid, 'settles credits owed')
  end
  publish('credits', {balance = balance()})
  return {'PAID', order_event()}
end

if action == 'begin_refund' then
  -- ARGV: now epoch, now_iso, the lot's remaining and the covered fen the refund
  -- was computed from, refundable credits, fen paid back, fee fen, refund id.
  -- Python computes (refunds.py); this checks nothing moved meanwhile and then
  -- takes the lot's remaining (bonus included) once.
  if field('refund_state') ~= '' then return {'BEGUN', redis.call('HGETALL', ORDER)} end
  if status ~= 'paid' and status ~= 'refunded' then return {'NOT_PAID'} end
  local now_epoch, now_iso = tonumber(ARGV[3]), ARGV[4]
  sweep(now_epoch, now_iso)
  local lot = field('lot')
  local remaining = load_lot(lot).remaining
  if remaining ~= tonumber(ARGV[5]) or number('covered_fen') ~= tonumber(ARGV[6]) then
    return {'STALE'}
  end
  local fen = tonumber(ARGV[8])
  take_from_lot(lot, remaining)
  if remaining > 0 then entry('purchase_refund', -remaining, now_iso, nil, oid, nil) end
  redis.call('HSET', ORDER, 'refund_id', ARGV[10], 'refund_credits', ARGV[7],
             'refund_fen', fen, 'refund_fee', ARGV[9], 'refund_state', 'pending')
  redis.call('HINCRBY', ORDER, 'covered_fen', fen)
  publish('credits', {balance = balance()})
  return {'BEGUN', order_event()}
end

if action == 'finish_refund' then
  -- The provider accepted our refund: the money is on its way back.
  local state = field('refund_state')
  if state == '' then return {'NONE'} end
  if state == 'pending' then
    redis.call('HSET', ORDER, 'refund_state', 'done', 'status', 'refunded',
               'refunded_fen', math.max(number('refunded_fen'), number('covered_fen')))
    order_event()
  end
  return {'DONE'}
end

if action == 'provider_refund' then
  -- ARGV: now epoch, now_iso, the cumulative refunded fen the provider reports.
  -- Only money beyond covered_fen is new, so a repeat, an older notice arriving
  -- late, or the notice of our own refund (its cumulative equals what
  -- begin_refund covered) takes nothing.
  if status ~= 'paid' and status ~= 'refunded' then return {'NOT_PAID'} end
  -- A provider never refunds more than the order's amount: a larger figure is
  -- clamped to it, so refunded_fen never exceeds the money paid.
  local fen = number('fen')
  local cumulative = math.min(tonumber(ARGV[5]), fen)
  local covered = number('covered_fen')
  if cumulative <= covered then
    if cumulative > number('refunded_fen') then
      redis.call('HSET', ORDER, 'refunded_fen', cumulative, 'status', 'refunded')
      order_event()
    end
    return {'SEEN', 0}
  end
  local now_epoch, now_iso = tonumber(ARGV[3]), ARGV[4]
  sweep(now_epoch, now_iso)
  -- 10 credits a yuan, counted on the cumulative figures (floor of each), so
  -- the same money in one notice or in several takes the same credits.
  local credits = math.floor(cumulative / 10) - math.floor(covered / 10)
  local taken = take_from_lot(field('lot'), credits)
  local rest = math.min(credits - taken, balance())
  if rest > 0 then
    take(rest)
    taken = taken + rest
  end
  if credits > taken then redis.call('HINCRBY', P, 'owed', credits - taken) end
  if taken > 0 then entry('purchase_refund', -taken, now_iso, nil, oid, nil) end
  redis.call('HSET', ORDER, 'covered_fen', cumulative, 'status', 'refunded',
             'refunded_fen', math.max(number('refunded_fen'), cumulative))
  if taken > 0 then publish('credits', {balance = balance()}) end
  return {'TAKEN', credits, order_event()}
end
return redis.error_reply('ERR orders: unknown action')
