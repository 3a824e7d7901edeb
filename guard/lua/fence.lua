-- fence.lua: advance the fence to a promised token; never lower it.
--
-- KEYS[1]  <prefix>:{<tag>}:fence       fence, decimal ('0' when absent)
-- ARGV[1]  token, decimal
-- Returns  {'ok', token} or {'stale', fence} when token < fence (guard.fence.advance)
local fence = redis.call('GET', KEYS[1]) or '0'
if decimal_lt(ARGV[1], fence) then
  return {'stale', fence}
end
if fence ~= ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1])
end
return {'ok', ARGV[1]}
