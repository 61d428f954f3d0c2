-- Open an account once, with its trial lot and `grant` entry; reopening is a read.
-- ARGV: uid, email, address key, now_iso, trial credits, expires epoch, expires_iso
if redis.call('EXISTS', P) == 0 then
  redis.call('HSET', P, 'id', ARGV[1], 'email', ARGV[2], 'address', ARGV[3],
             'created_at', ARGV[4], 'balance', 0, 'owed', 0, 'seq', 0, 'lotseq', 0)
  local trial = tonumber(ARGV[5])
  if trial > 0 then
    add_lot('trial', trial, tonumber(ARGV[6]), ARGV[7], ARGV[4], nil)
    entry('grant', trial, ARGV[4], nil, nil, 'trial credits')
  end
  return {1, redis.call('HGETALL', P)}
end
return {0, redis.call('HGETALL', P)}
