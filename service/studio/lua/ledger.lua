-- Shared prelude of every account script. KEYS[1] is the account hash
-- `studio:acct:{<uid>}`; every other key is derived from it and carries the same
-- hash tag, so each script touches one slot (Redis Cluster safe).
-- Invariants kept by every script: balance = sum of the ledger's amounts
-- = sum of the lots' `remaining`, and balance >= 0.
local P = KEYS[1]
local LOTS, LOT, LEDGER = P .. ':lots', P .. ':lot', P .. ':ledger'
local GENS, ACTIVE = P .. ':gens', P .. ':active'
local CHANNEL = 'studio:events:' .. string.match(P, '{(.-)}')

local function gen_key(gid) return P .. ':gen:' .. gid end

local function balance() return tonumber(redis.call('HGET', P, 'balance') or '0') end

local function publish(event, data)
  redis.call('PUBLISH', CHANNEL, cjson.encode({event = event, data = data}))
end

-- Append one ledger entry; the balance must already hold its effect.
local function entry(kind, amount, now_iso, gid, oid, note)
  local seq = redis.call('HINCRBY', P, 'seq', 1)
  redis.call('RPUSH', LEDGER, cjson.encode({
    id = 'e' .. seq, kind = kind, amount = amount, balance_after = balance(),
    generation_id = gid or cjson.null, order_id = oid or cjson.null,
    note = note or cjson.null, created_at = now_iso}))
end

local function load_lot(id) return cjson.decode(redis.call('HGET', LOT, id)) end
local function save_lot(id, lot) redis.call('HSET', LOT, id, cjson.encode(lot)) end

-- A new lot: trial and bonus lots are spent first, soonest expiry first;
-- purchase lots after them, oldest first (the refund policy's order).
local function add_lot(kind, amount, expires, expires_iso, now_iso, order_id)
  local id = 'l' .. redis.call('HINCRBY', P, 'lotseq', 1)
  local priority = expires
  if kind == 'purchase' then priority = 1e10 + tonumber(redis.call('HGET', P, 'lotseq')) end
  save_lot(id, {kind = kind, granted = amount, remaining = amount, expires = expires,
                expires_at = expires_iso, order_id = order_id or cjson.null,
                created_at = now_iso})
  redis.call('ZADD', LOTS, priority, id)
  redis.call('HINCRBY', P, 'balance', amount)
  return id
end

-- Credits past their lot's expiry leave the balance with an `expire` entry.
local function sweep(now_epoch, now_iso)
  local expired = false
  for _, id in ipairs(redis.call('ZRANGE', LOTS, 0, -1)) do
    local lot = load_lot(id)
    if lot.remaining > 0 and lot.expires <= now_epoch then
      local n = lot.remaining
      lot.remaining = 0
      save_lot(id, lot)
      redis.call('HINCRBY', P, 'balance', -n)
      entry('expire', -n, now_iso, nil, lot.order_id ~= cjson.null and lot.order_id or nil, nil)
      expired = true
    end
  end
  -- The balance changed, whatever the caller goes on to do (even refuse).
  if expired then publish('credits', {balance = balance()}) end
end

-- Take `amount` from the lots in spending order; the caller checked the balance.
local function take(amount)
  local taken, left = {}, amount
  for _, id in ipairs(redis.call('ZRANGE', LOTS, 0, -1)) do
    if left == 0 then break end
    local lot = load_lot(id)
    if lot.remaining > 0 then
      local n = math.min(lot.remaining, left)
      lot.remaining = lot.remaining - n
      left = left - n
      taken[id] = n
      save_lot(id, lot)
    end
  end
  redis.call('HINCRBY', P, 'balance', -amount)
  return taken
end

-- Give credits back to the lots they came from, with their kind and expiry.
local function give_back(taken)
  local total = 0
  for id, n in pairs(taken) do
    local lot = load_lot(id)
    lot.remaining = lot.remaining + n
    save_lot(id, lot)
    total = total + n
  end
  redis.call('HINCRBY', P, 'balance', total)
  return total
end

local function gen_event(gid)
  local flat = redis.call('HGETALL', gen_key(gid))
  local fields = {}
  for i = 1, #flat, 2 do fields[flat[i]] = flat[i + 1] end
  publish('generation', fields)
  return flat
end
