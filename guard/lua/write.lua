-- write.lua: judge a write's token against the fence, apply its ops, advance the fence,
-- and remember its idempotency key: all or nothing, in one script (steps in fenced.lua).
--
-- KEYS[1]  <prefix>:{<tag>}:fence       fence, decimal ('0' when absent)
-- KEYS[2]  <prefix>:{<tag>}:data        hash: key -> '<token>:<value bytes>'
-- KEYS[3]  <prefix>:{<tag>}:idem:<key>  '<fence>:<token>:<recorded_at_ms>' (named even
--                                       without a key)
-- KEYS[4]  <prefix>:{<tag>}:lease       the lease backend's hash (read in strict mode only)
-- ARGV[1]  token, decimal
-- ARGV[2]  fence mode: 'monotonic' | 'strict' | 'off' (any other: as monotonic)
-- ARGV[3]  '1' if the write carries an idempotency key, else '0'
-- ARGV[4]  idempotency ttl in ms
-- ARGV[5]  number of ops n; then ARGV[6..] the ops in order, each
--          'P', key, value   (put)   or   'D', key, ''   (delete)
-- Returns  {outcome, fence, applied_by} with decimal strings; applied_by is the token that
--          applied the write's idempotency key, '0' if none did (or the write has no key):
--          'ok'       applied; fence = max(fence, token)
--          'stale'    token < fence (modes monotonic and strict), key known or not:
--                     nothing applied
--          'not_live' strict mode and the token is not the resource's live lease
--          'replayed' the token may write and the key was recorded: nothing applied;
--                     the recorded fence
--
-- The rule is guard.fence.judge's (token first, then key); strict mode also requires
-- token >= fence (G3).
local outcome, fence, by = fenced_write(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2],
                                        ARGV[3] == '1', ARGV[4], ARGV, 6, tonumber(ARGV[5]))
return {outcome, fence, by}
