-- own_keys_write.lua: a fenced write to the caller's own keys (fencing.redis), after
-- decimal.lua. Judge the token against the resource's fence, apply every op in order,
-- advance the fence: all or nothing, in one script, so on a Redis Cluster every key must
-- share the fence's hash slot (the client checks: the resource's hash tag).
--
-- KEYS[1]        <prefix>:{<tag>}:fence   the fence, decimal ('0' when absent); the same
--                                         key the guard's Redis store fences with
-- KEYS[2..n+1]   the caller's keys, one per op, in order
-- ARGV[1]        token, decimal
-- ARGV[2i-2], ARGV[2i-1] for KEYS[i] (i >= 2): 'P', value (SET)  or  'D', '' (DEL)
-- Returns        {outcome, fence} with the fence a decimal string:
--                'ok'     applied; fence = max(fence, token)
--                'stale'  token < fence: nothing applied
local token = ARGV[1]
local fence = redis.call('GET', KEYS[1]) or '0'
if decimal_lt(token, fence) then
  return {'stale', fence}
end
for i = 2, #KEYS do
  if ARGV[2 * i - 2] == 'P' then
    redis.call('SET', KEYS[i], ARGV[2 * i - 1])
  else
    redis.call('DEL', KEYS[i])
  end
end
if decimal_lt(fence, token) then
  redis.call('SET', KEYS[1], token)
  fence = token
end
return {'ok', fence}
