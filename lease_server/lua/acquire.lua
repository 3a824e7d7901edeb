-- acquire.lua: grant a free or expired lease, replay a retried request, or report the holder.
--
-- KEYS[1]  <prefix>:{<tag>}:lease    hash holder/token/request_id; PEXPIRE = the lease's ttl
-- KEYS[2]  <prefix>:{<tag>}:counter  last token issued, decimal; never expires or is deleted
-- ARGV[1]  holder
-- ARGV[2]  ttl_ms
-- ARGV[3]  request_id ('' = none)
-- ARGV[4]  '1': token = max(counter + 1, Redis TIME in microseconds) (the clock floor)
--          '0': token = counter + 1 (dense; only for tests of the floor itself)
-- Returns  {outcome, token, ms, holder}; token is a decimal string and
--          outcome 'granted'  (ms = ttl_ms),
--                  'replayed' (same non-empty request_id and holder; ms = time left),
--                  'held'     (someone else's unexpired lease; ms = time left).
--
-- A lease is live while its hash exists: Redis expires it by its own clock. The
-- counter is bumped by INCR (exact 64-bit, errors rather than wrap at 2^63 - 1).
local lease = redis.call('HMGET', KEYS[1], 'holder', 'token', 'request_id')
if lease[2] then
  local left = redis.call('PTTL', KEYS[1])
  if ARGV[3] ~= '' and lease[3] == ARGV[3] and lease[1] == ARGV[1] then
    return {'replayed', lease[2], left, lease[1]}
  end
  return {'held', lease[2], left, lease[1]}
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
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token, 'request_id', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {'granted', token, tonumber(ARGV[2]), ARGV[1]}
