-- release.lua: free the resource now (the counter stays) and announce it.
--
-- KEYS[1]  <prefix>:{<tag>}:lease    hash holder/token/request_id
-- ARGV[1]  token, decimal
-- ARGV[2]  holder ('' skips the holder check)
-- ARGV[3]  pub/sub channel (<prefix>:released)
-- ARGV[4]  the resource, raw: the message published on the channel
-- Returns  'released' or 'lost' (no live lease, another token or holder)
local lease = redis.call('HMGET', KEYS[1], 'holder', 'token')
if not lease[2] or lease[2] ~= ARGV[1] or (ARGV[2] ~= '' and lease[1] ~= ARGV[2]) then
  return 'lost'
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 'released'
