-- reset_fence.lua: an operator's reset of a fence, lower or higher (guard.fence.reset_to).
--
-- KEYS[1]  <prefix>:{<tag>}:fence       fence, decimal ('0' when absent)
-- KEYS[2]  <prefix>:{<tag>}:counter     the lease backend's last token issued (absent
--                                       when no lease server shares this prefix)
-- ARGV[1]  the new fence, decimal: the lease server's counter for the resource
-- Returns  {'ok', the fence it replaced}, or {'below', counter} when the new fence is
--          below a token the lease backend granted (nothing changed)
local counter = redis.call('GET', KEYS[2]) or '0'
if decimal_lt(ARGV[1], counter) then
  return {'below', counter}
end
local before = redis.call('GET', KEYS[1]) or '0'
redis.call('SET', KEYS[1], ARGV[1])
return {'ok', before}
