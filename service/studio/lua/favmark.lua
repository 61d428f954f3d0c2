-- The favoriting account's side of a favorite: its list (favs, favowner,
-- favat), changed in the order of the owner's side. KEYS[1] is the favoriting
-- account's hash; every key derives from it (one slot).
-- ARGV: '1' (favorite) | '0' (unfavorite), work id, change number ('' when
-- the work is gone: applied whatever came before), owner, now_iso.
-- Two requests of one account race between the owner's script and this one;
-- the change number the owner's script gave each (works.lua) lets only the
-- later one decide, so the list ends as the owner's set of fans does.
local P, on, wid, change = KEYS[1], ARGV[1] == '1', ARGV[2], ARGV[3]
local VERSIONS = P .. ':favver'
if change == '' then
  redis.call('HDEL', VERSIONS, wid)
else
  if tonumber(change) <= tonumber(redis.call('HGET', VERSIONS, wid) or '0') then
    return 0
  end
  redis.call('HSET', VERSIONS, wid, change)
end
if on then
  if redis.call('ZSCORE', P .. ':favs', wid) == false then
    redis.call('ZADD', P .. ':favs', redis.call('HINCRBY', P, 'favseq', 1), wid)
  end
  redis.call('HSET', P .. ':favowner', wid, ARGV[4])
  -- when, for "export my data"; a repeated favorite keeps the first
  redis.call('HSETNX', P .. ':favat', wid, ARGV[5])
else
  redis.call('ZREM', P .. ':favs', wid)
  redis.call('HDEL', P .. ':favowner', wid)
  redis.call('HDEL', P .. ':favat', wid)
end
return 1
