-- renew.lua: extend the current unexpired lease to now + ttl_ms.
--
-- KEYS[1]  <prefix>:{<tag>}:lease    hash holder/token/request_id
-- ARGV[1]  token, decimal
-- ARGV[2]  holder ('' skips the holder check: the token alone is the proof)
-- ARGV[3]  ttl_ms
-- Returns  {'renewed', holder} or {'lost', ''} (no live lease, another token or holder)
local lease = redis.call('HMGET', KEYS[1], 'holder', 'token')
if not lease[2] or lease[2] ~= ARGV[1] or (ARGV[2] ~= '' and lease[1] ~= ARGV[2]) then
  return {'lost', ''}
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'renewed', lease[1]}
