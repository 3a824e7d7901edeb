-- fence.lua: advance the fence to a promised token; never lower it.
--
-- KEYS[1]  <prefix>:{<tag>}:fence       fence, decimal ('0' when absent)
-- KEYS[2]  <prefix>:{<tag>}:lease       the lease backend's hash (read in strict mode only)
-- ARGV[1]  token, decimal
-- ARGV[2]  fence mode ('strict': the token must be the live lease; any other: not checked)
-- Returns  {'ok', token}, {'stale', fence} when token < fence (guard.fence.advance), or
--          {'not_live', fence} in strict mode when the token is not the live lease
--          (guard.fence.may_fence: a token nobody holds must not raise the fence)
local fence = redis.call('GET', KEYS[1]) or '0'
if decimal_lt(ARGV[1], fence) then
  return {'stale', fence}
end
if ARGV[2] == 'strict' and redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then
  return {'not_live', fence}
end
if fence ~= ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1])
end
return {'ok', ARGV[1]}
