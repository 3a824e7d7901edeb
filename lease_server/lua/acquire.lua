-- acquire.lua: grant a free or expired lease, replay a retried request, or report the holder;
-- a grant appends its events (eventlog.lua) in the same script.
--
-- KEYS[1]  <prefix>:{<tag>}:lease    hash holder/token/request_id; PEXPIREAT = its expiry
-- KEYS[2]  <prefix>:{<tag>}:counter  last token issued, decimal; never expires or is deleted
-- KEYS[3..6] LOG, HEAD, COMPACT, OWED;  KEYS[7] DUE (one Redis only)
-- ARGV[1]  holder
-- ARGV[2]  ttl_ms
-- ARGV[3]  request_id ('' = none)
-- ARGV[4]  '1': token = max(counter + 1, Redis TIME in microseconds) (the clock floor)
--          '0': token = counter + 1 (dense; only for tests of the floor itself)
-- ARGV[5]  the resource, raw
-- ARGV[6]  maxlen of a per-resource log ('0': one shared log, pruned separately)
-- ARGV[7]  the events channel;  ARGV[8] '1' if the log is per resource
-- Returns  {outcome, token, ms, holder, revision}; token is a decimal string and
--          outcome 'granted'  (ms = ttl_ms; revision = that of its ACQUIRED),
--                  'replayed' (same non-empty request_id and holder; ms = time left),
--                  'held'     (someone else's unexpired lease; ms = time left);
--          revision '0' when nothing was appended.
--
-- A lease is live while its hash exists: Redis expires it by its own clock. The
-- counter is bumped by INCR (exact 64-bit, errors rather than wrap at 2^63 - 1).
local lease = redis.call('HMGET', KEYS[1], 'holder', 'token', 'request_id')
if lease[2] then
  local left = redis.call('PTTL', KEYS[1])
  if ARGV[3] ~= '' and lease[3] == ARGV[3] and lease[1] == ARGV[1] then
    return {'replayed', lease[2], left, lease[1], '0'}
  end
  return {'held', lease[2], left, lease[1], '0'}
end
local resource = ARGV[5]
-- Taking over a lease that expired unlogged: its EXPIRED comes first.
local owed = redis.call('HGET', KEYS[6], resource)
if owed then
  local old_token, old_holder = owed_split(owed)
  log_append(KEYS[3], KEYS[4], 'expired', resource, old_token, old_holder, '0')
end
redis.call('INCR', KEYS[2])
local token = redis.call('GET', KEYS[2])
if ARGV[4] == '1' then
  local floor = now_us()
  if decimal_lt(token, floor) then
    redis.call('SET', KEYS[2], floor)
    token = floor
  end
end
local expires = string.format('%d', tonumber(now_ms()) + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token, 'request_id', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], expires)
redis.call('HSET', KEYS[6], resource, token .. ':' .. ARGV[1])
if KEYS[7] then
  redis.call('ZADD', KEYS[7], expires, resource)
end
local revision = log_append(KEYS[3], KEYS[4], 'acquired', resource, token, ARGV[1], ARGV[2])
log_trim(KEYS[3], KEYS[5], revision, ARGV[6])
log_publish(ARGV[7], ARGV[8], revision, resource)
return {'granted', token, tonumber(ARGV[2]), ARGV[1], revision}
