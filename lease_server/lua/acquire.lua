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
-- A lease is live while its hash exists: Redis expires it by its own clock.
local seen = lease_seen(KEYS[1], ARGV[1], ARGV[3])
if seen then
  return seen
end
local token = grant(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1')
return {'granted', token, tonumber(ARGV[2]), ARGV[1]}
