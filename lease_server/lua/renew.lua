-- renew.lua: extend the current unexpired lease to now + ttl_ms. A renewal is not an
-- event: nothing is appended, the log's head and a follower's fence stay where they are.
--
-- KEYS[1]  <prefix>:{<tag>}:lease    hash holder/token/request_id
-- KEYS[2..5] LOG, HEAD, COMPACT, OWED;  KEYS[6] DUE (one Redis only)  (eventlog.lua)
-- ARGV[1]  token, decimal
-- ARGV[2]  holder ('' skips the holder check: the token alone is the proof)
-- ARGV[3]  ttl_ms
-- ARGV[4]  the resource, raw
-- ARGV[5]  maxlen of a per-resource log ('0': one shared log)
-- ARGV[6]  the events channel;  ARGV[7] '1' if the log is per resource
-- Returns  {'renewed', holder, '0'} or {'lost', '', '0'} (no live lease, another
--          token or holder)
local lease = redis.call('HMGET', KEYS[1], 'holder', 'token')
if not lease[2] or lease[2] ~= ARGV[1] or (ARGV[2] ~= '' and lease[1] ~= ARGV[2]) then
  return {'lost', '', '0'}
end
local resource = ARGV[4]
local expires = string.format('%d', tonumber(now_ms()) + tonumber(ARGV[3]))
redis.call('PEXPIREAT', KEYS[1], expires)
-- Also (re)states what is owed, for a lease granted before the log existed.
redis.call('HSET', KEYS[5], resource, lease[2] .. ':' .. lease[1])
if KEYS[6] then
  redis.call('ZADD', KEYS[6], expires, resource)
end
return {'renewed', lease[1], '0'}
