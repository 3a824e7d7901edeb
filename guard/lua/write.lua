-- write.lua: judge a write's token against the fence, apply its ops, advance the fence,
-- and remember its idempotency key: all or nothing, in one script (steps in fenced.lua).
--
-- KEYS[1]  <prefix>:{<tag>}:fence       fence, decimal ('0' when absent)
-- KEYS[2]  <prefix>:{<tag>}:data        hash: key -> '<token>:<value bytes>'
-- KEYS[3]  <prefix>:{<tag>}:idem:<key>  '<fence>:<recorded_at_ms>' (named even without a key)
-- KEYS[4]  <prefix>:{<tag>}:lease       the lease backend's hash (read in strict mode only)
-- ARGV[1]  token, decimal
-- ARGV[2]  fence mode: 'monotonic' | 'strict' | 'off' (any other: as monotonic)
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
local outcome, fence = fenced_write(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2],
                                    ARGV[3] == '1', ARGV[4], ARGV, 6, tonumber(ARGV[5]))
return {outcome, fence}
