-- renew.lua: extend the current unexpired lease to now + ttl_ms, or, for ttl_ms '0', by
-- the lease's own ttl (its hash's ttl_ms: the ttl of its grant or last renewal; 10000,
-- leases.LEGACY_TTL_MS, for a lease granted before it was kept). The ttl granted becomes
-- the lease's own. A renewal is not an event: nothing is appended, the log's head and a
-- follower's fence stay where they are.
--
-- KEYS[1]  <prefix>:{<tag>}:lease    hash holder/token/request_id/ttl_ms
-- KEYS[2..5] LOG, HEAD, COMPACT, OWED;  KEYS[6] DUE (one Redis only)  (eventlog.lua)
-- ARGV[1]  token, decimal
-- ARGV[2]  holder ('' skips the holder check: the token alone is the proof)
-- ARGV[3]  ttl_ms ('0': the lease's own)
-- ARGV[4]  the resource, raw
-- ARGV[5]  maxlen of a per-resource log ('0': one shared log)
-- ARGV[6]  the events channel;  ARGV[7] '1' if the log is per resource
-- Returns  {'renewed', holder, ttl_ms granted} or {'lost', '', '0'} (no live lease, another
--          token or holder)
local lease = redis.call('HMGET', KEYS[1], 'holder', 'token', 'ttl_ms')
if not lease[2] or lease[2] ~= ARGV[1] or (ARGV[2] ~= '' and lease[1] ~= ARGV[2]) then
  return {'lost', '', '0'}
end
local resource = ARGV[4]
local ttl = ARGV[3]
if ttl == '0' then
  ttl = lease[3] or '10000'
end
local expires = string.format('%d', tonumber(now_ms()) + tonumber(ttl))
redis.call('HSET', KEYS[1], 'ttl_ms', ttl)
redis.call('PEXPIREAT', KEYS[1], expires)
-- Also (re)states what is owed, for a lease granted before the log existed.
redis.call('HSET', KEYS[5], resource, lease[2] .. ':' .. lease[1])
if KEYS[6] then
  redis.call('ZADD', KEYS[6], expires, resource)
end
return {'renewed', lease[1], ttl}
