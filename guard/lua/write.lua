-- write.lua: judge a write's token against the fence, apply its ops, advance the fence,
-- and remember its idempotency key: all or nothing, in one script.
--
-- KEYS[1]  <prefix>:{<tag>}:fence       fence, decimal ('0' when absent)
-- KEYS[2]  <prefix>:{<tag>}:data        hash: key -> '<token>:<value bytes>'
-- KEYS[3]  <prefix>:{<tag>}:idem:<key>  '<fence>:<recorded_at_ms>' (named even without a key)
-- KEYS[4]  <prefix>:{<tag>}:lease       the lease backend's hash (read in strict mode only)
-- ARGV[1]  token, decimal
-- ARGV[2]  fence mode: 'monotonic' | 'strict' | 'off'
-- ARGV[3]  '1' if the write carries an idempotency key, else '0'
-- ARGV[4]  idempotency ttl in ms
-- ARGV[5]  number of ops n; then ARGV[6..] the ops in order, each
--          'P', key, value   (put)   or   'D', key, ''   (delete)
-- Returns  {outcome, fence} with fence a decimal string:
--          'ok'       applied; fence = max(fence, token)
--          'replayed' the idempotency key was recorded: nothing applied; its fence
--          'stale'    token < fence (modes monotonic and strict): nothing applied
--          'not_live' strict mode and the token is not the resource's live lease
--
-- The rule is guard.fence.admit's; strict mode also requires token >= fence (G3).
local fence = redis.call('GET', KEYS[1]) or '0'
local token = ARGV[1]
local mode = ARGV[2]
if ARGV[3] == '1' then
  local seen = redis.call('GET', KEYS[3])
  if seen then
    return {'replayed', string.match(seen, '^(%d+)')}
  end
end
if mode ~= 'off' and decimal_lt(token, fence) then
  return {'stale', fence}
end
if mode == 'strict' and redis.call('HGET', KEYS[4], 'token') ~= token then
  return {'not_live', fence}
end
local n = tonumber(ARGV[5])
for i = 0, n - 1 do
  local at = 6 + 3 * i
  if ARGV[at] == 'P' then
    redis.call('HSET', KEYS[2], ARGV[at + 1], token .. ':' .. ARGV[at + 2])
  else
    redis.call('HDEL', KEYS[2], ARGV[at + 1])
  end
end
local new = fence
if decimal_lt(fence, token) then
  new = token
  redis.call('SET', KEYS[1], new)
end
if ARGV[3] == '1' then
  redis.call('SET', KEYS[3], new .. ':' .. now_ms(), 'PX', ARGV[4])
end
return {'ok', new}
