-- release.lua: free the resource now (the counter stays), announce it, append RELEASED.
--
-- KEYS[1]  <prefix>:{<tag>}:lease    hash holder/token/request_id
-- KEYS[2..5] LOG, HEAD, COMPACT, OWED;  KEYS[6] DUE (one Redis only)  (eventlog.lua)
-- ARGV[1]  token, decimal
-- ARGV[2]  holder ('' skips the holder check)
-- ARGV[3]  pub/sub channel (<prefix>:released)
-- ARGV[4]  the resource, raw: the message published on the channel
-- ARGV[5]  maxlen of a per-resource log ('0': one shared log)
-- ARGV[6]  the events channel;  ARGV[7] '1' if the log is per resource
-- Returns  {'released', revision} or {'lost', '0'} (no live lease, another token or holder)
local lease = redis.call('HMGET', KEYS[1], 'holder', 'token')
if not lease[2] or lease[2] ~= ARGV[1] or (ARGV[2] ~= '' and lease[1] ~= ARGV[2]) then
  return {'lost', '0'}
end
local resource = ARGV[4]
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[5], resource)
if KEYS[6] then
  redis.call('ZREM', KEYS[6], resource)
end
redis.call('PUBLISH', ARGV[3], resource)
local revision = log_append(KEYS[2], KEYS[3], 'released', resource, lease[2], lease[1], '0')
log_trim(KEYS[2], KEYS[4], revision, ARGV[5])
log_publish(ARGV[6], ARGV[7], revision, resource)
return {'released', revision}
