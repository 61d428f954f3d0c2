-- The square's writes; every key shares the {square} hash tag (one slot).
-- KEYS[1] = studio:square:{square} (prefix). ARGV[1] = action.
-- Indexes: feed (publish order), top (favorites, ties newest first), and the
-- same two per kind; top's score is favorites * 2^32 + publish sequence.
local S, action = KEYS[1], ARGV[1]
local TWO32 = 4294967296

local function indexes(kind)
  return {S .. ':feed', S .. ':feed:' .. kind, S .. ':top', S .. ':top:' .. kind}
end

if action == 'publish' then
  -- ARGV: work id, owner id, kind, favorites, public JSON without its
  -- published_at and favorites (added here), now_iso
  local id, owner, kind, favorites = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
  local key = S .. ':work:' .. id
  local existing = redis.call('GET', key)
  if existing then return existing end
  local seq = redis.call('INCR', S .. ':seq')
  redis.call('INCR', S .. ':version')  -- cached pages everywhere show it at once
  local work = cjson.decode(ARGV[6])
  work.published_at = ARGV[7]
  work.favorites = favorites
  local body = cjson.encode(work)
  redis.call('SET', key, body)
  redis.call('HSET', S .. ':meta:' .. id, 'owner', owner, 'kind', kind, 'seq', seq)
  local idx = indexes(kind)
  redis.call('ZADD', idx[1], seq, id)
  redis.call('ZADD', idx[2], seq, id)
  redis.call('ZADD', idx[3], favorites * TWO32 + seq, id)
  redis.call('ZADD', idx[4], favorites * TWO32 + seq, id)
  return body
end

if action == 'remove' then
  -- ARGV: work id. Bumps the version: no process serves a cached page with it.
  local id = ARGV[2]
  local kind = redis.call('HGET', S .. ':meta:' .. id, 'kind')
  redis.call('INCR', S .. ':version')
  if not kind then return 0 end
  for _, index in ipairs(indexes(kind)) do redis.call('ZREM', index, id) end
  redis.call('DEL', S .. ':work:' .. id, S .. ':meta:' .. id)
  return 1
end

if action == 'favorites' then
  -- ARGV: work id, count, change number (from the owner's slot): only newer apply
  local id, count, change = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
  local meta = S .. ':meta:' .. id
  local kind = redis.call('HGET', meta, 'kind')
  if not kind then return 0 end
  if change <= tonumber(redis.call('HGET', meta, 'change') or '0') then return 0 end
  redis.call('HSET', meta, 'change', change)
  local seq = tonumber(redis.call('HGET', meta, 'seq'))
  local work = cjson.decode(redis.call('GET', S .. ':work:' .. id))
  work.favorites = count
  redis.call('SET', S .. ':work:' .. id, cjson.encode(work))
  redis.call('ZADD', S .. ':top', count * TWO32 + seq, id)
  redis.call('ZADD', S .. ':top:' .. kind, count * TWO32 + seq, id)
  return 1
end

if action == 'page' then
  -- ARGV: sort (new|top), kind ('' = all), before ('' = first page),
  --       limit, epoch (top cursor pages; '' = current), now_ms
  -- Reply: {next score or '', epoch or '', work JSON...}
  local sort, kind, before, limit = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
  local suffix = kind ~= '' and (':' .. kind) or ''
  local index = S .. ':' .. (sort == 'top' and 'top' or 'feed') .. suffix
  local epoch = ''
  if sort == 'top' then
    -- Pages of `top` read a snapshot of the ranking taken at most every 2 s,
    -- named in the cursor, so favorites changing between pages neither repeat
    -- nor skip an item.
    local pointer = S .. ':top' .. suffix .. ':epoch'
    epoch = ARGV[6]
    if epoch == '' then
      local n = tonumber(redis.call('HGET', pointer, 'n') or '0')
      local at = tonumber(redis.call('HGET', pointer, 'at') or '0')
      local now = tonumber(ARGV[7])
      if n == 0 or now - at >= 2000 then
        n = n + 1
        local snapshot = index .. ':e' .. n
        redis.call('ZUNIONSTORE', snapshot, 1, index)
        redis.call('PEXPIRE', snapshot, 600000)
        redis.call('HSET', pointer, 'n', n, 'at', now)
      end
      epoch = tostring(n)
    end
    index = index .. ':e' .. epoch
  end
  local top = before ~= '' and ('(' .. before) or '+inf'
  local found = redis.call('ZREVRANGEBYSCORE', index, top, '-inf', 'WITHSCORES',
                           'LIMIT', 0, limit + 1)
  local out = {'', epoch}
  local rows = math.min(limit, #found / 2)
  if #found / 2 > limit then out[1] = found[2 * rows] end
  for i = 1, rows do
    local body = redis.call('GET', S .. ':work:' .. found[2 * i - 1])
    if body then out[#out + 1] = body end  -- unpublished since the snapshot
  end
  return out
end
return redis.error_reply('ERR square: unknown action')
