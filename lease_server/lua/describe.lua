-- describe.lua: the lease and the counter, read together.
--
-- KEYS[1]  <prefix>:{<tag>}:lease    hash holder/token/request_id
-- KEYS[2]  <prefix>:{<tag>}:counter  last token issued
-- Returns  {holder, token, remaining_ms, last_token}: holder '' and token '0' when free;
--          tokens as decimal strings.
local lease = redis.call('HMGET', KEYS[1], 'holder', 'token')
local last = redis.call('GET', KEYS[2]) or '0'
if not lease[2] then
  return {'', '0', 0, last}
end
return {lease[1], lease[2], redis.call('PTTL', KEYS[1]), last}
