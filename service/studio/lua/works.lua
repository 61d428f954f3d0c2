-- A person's works, their favorites and reports; KEYS[1] is the owner's account
-- hash studio:acct:{<uid>} and every key derives from it (one slot).
-- ARGV[1] = action, ARGV[2] = work id.
-- KEYS[2], given for the actions a retry could not redo (delete, report), is
-- the call's own key in the same slot: the store's client retries a call whose
-- reply was lost, Redis may have run the first try, and the retry must answer
-- what it did (not NOT_FOUND or REPEAT), so its reply is kept there a minute.
local P, action, wid = KEYS[1], ARGV[1], ARGV[2]
local key = P .. ':work:' .. wid
local FANS, REPORTS = key .. ':fans', key .. ':reports'

if KEYS[2] then
  local done = redis.call('GET', KEYS[2])
  if done then return cjson.decode(done) end
end
local function kept(reply)
  if KEYS[2] then redis.call('SET', KEYS[2], cjson.encode(reply), 'EX', 60) end
  return reply
end

local raw = redis.call('GET', key)
if not raw then return {'NOT_FOUND'} end
local work = cjson.decode(raw)

local function save() redis.call('SET', key, cjson.encode(work)) end

if action == 'publish' then
  -- ARGV: now_iso. Publishing twice keeps the first time; a work an operator
  -- removed (upheld report) is not published again.
  if work.removed_at then return {'REMOVED'} end
  if work.published_at == cjson.null then
    work.published_at = ARGV[3]
    save()
  end
  return {'OK', cjson.encode(work), redis.call('SCARD', FANS), work.hidden and 1 or 0}
end

if action == 'unpublish' then
  work.published_at = cjson.null
  save()
  return {'OK', cjson.encode(work), redis.call('SCARD', FANS)}
end

if action == 'remove' then
  -- ARGV: now_iso. An operator upheld a report: off the square for good, and
  -- the author's library says so. Removing again (a decision carried out
  -- once more: takedown.py) keeps the first time.
  work.published_at = cjson.null
  if not work.removed_at or work.removed_at == cjson.null then
    work.removed_at = ARGV[3]
  end
  save()
  return {'OK', cjson.encode(work)}
end

if action == 'rekey' then
  -- ARGV: for the media then the thumbnail, the key the work holds, the new
  -- key and its URL ('' for a work without that file). A removed work's files
  -- move to keys nobody was given (takedown.py): STALE when the work holds
  -- other keys by now, so the caller deletes the copies instead.
  local held = {work.media_key, work.thumb_key}
  for i = 1, 2 do
    local file = held[i]
    if file == nil or file == cjson.null then file = '' end
    if file ~= ARGV[3 * i] then return {'STALE'} end
  end
  if ARGV[3] ~= '' then work.media_key, work.media_url = ARGV[4], ARGV[5] end
  if ARGV[6] ~= '' then work.thumb_key, work.thumb_url = ARGV[7], ARGV[8] end
  save()
  return {'OK'}
end

if action == 'delete' then
  -- Returns the work (for its media) and who favorited it (their lists shrink).
  local fans = redis.call('SMEMBERS', FANS)
  -- out of every collection it was in (collections.lua)
  for _, cid in ipairs(redis.call('SMEMBERS', key .. ':cols')) do
    redis.call('ZREM', P .. ':col:' .. cid .. ':works', wid)
  end
  redis.call('DEL', key, FANS, REPORTS, key .. ':cols')
  redis.call('ZREM', P .. ':works', wid)
  return kept({'OK', raw, fans})
end

if action == 'favorite' or action == 'unfavorite' then
  -- ARGV: the account that (un)favorites. The change number orders the counts
  -- that reach the square, so a late update never overwrites a newer one.
  local changed
  if action == 'favorite' then
    changed = redis.call('SADD', FANS, ARGV[3])
  else
    changed = redis.call('SREM', FANS, ARGV[3])
  end
  local change = redis.call('HINCRBY', P, 'favchange', 1)
  return {'OK', redis.call('SCARD', FANS), change, changed,
          work.published_at ~= cjson.null and not work.hidden and 1 or 0}
end

if action == 'report' then
  -- ARGV: reporter, threshold. The owner's own reports count for nothing.
  if ARGV[3] == string.match(P, '{(.-)}') then return {'SELF'} end
  if work.published_at == cjson.null then return {'NOT_PUBLISHED'} end
  if work.hidden then
    -- Off the square: a repeat by one who reported it counts once; to anyone
    -- else it is as absent as any work they cannot see.
    if redis.call('SISMEMBER', REPORTS, ARGV[3]) == 1 then return {'REPEAT'} end
    return {'NOT_FOUND'}
  end
  if redis.call('SADD', REPORTS, ARGV[3]) == 0 then return {'REPEAT'} end
  if redis.call('SCARD', REPORTS) >= tonumber(ARGV[4]) then
    work.hidden = true
    save()
    return kept({'HIDE'})
  end
  return kept({'OK'})
end

if action == 'restore' then
  work.hidden = nil
  save()
  redis.call('DEL', REPORTS)
  return {'OK', cjson.encode(work), redis.call('SCARD', FANS)}
end
return redis.error_reply('ERR works: unknown action')
