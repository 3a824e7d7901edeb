-- prune.lua: forget one idempotency record if it was recorded before a cutoff.
--
-- KEYS[1]  <prefix>:{<tag>}:idem:<key>  '<fence>:<token>:<recorded_at_ms>' (older: no token)
-- ARGV[1]  cutoff, ms since the epoch
-- Returns  1 if deleted, 0 if absent or recorded at or after the cutoff
local seen = redis.call('GET', KEYS[1])
if not seen then
  return 0
end
local at = string.match(seen, ':(%d+)$')
if at and decimal_lt(at, ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
