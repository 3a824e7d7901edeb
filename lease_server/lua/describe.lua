-- describe.lua: the lease and the counter, read together.
--
-- KEYS[1]  <prefix>:{<tag>}:lease    hash holder/token/request_id/ttl_ms
-- KEYS[2]  <prefix>:{<tag>}:counter  last token issued
-- Returns  {holder, token, remaining_ms, last_token, ttl_ms}: holder '' and token '0'
--          when free; tokens as decimal strings; ttl_ms the lease's own ('10000',
--          leases.LEGACY_TTL_MS, for a lease granted before it was kept; '0' when free).
local lease = redis.call('HMGET', KEYS[1], 'holder', 'token', 'ttl_ms')
local last = redis.call('GET', KEYS[2]) or '0'
if not lease[2] then
  return {'', '0', 0, last, '0'}
end
return {lease[1], lease[2], redis.call('PTTL', KEYS[1]), last, lease[3] or '10000'}
