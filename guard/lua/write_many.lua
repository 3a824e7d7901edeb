-- write_many.lua: one write over several resources, all or nothing: every token is
-- judged before anything is applied, and before the idempotency key (guard.fence.judge_all).
--
-- KEYS     4 per resource, resources in sorted order: fence, data, idem:<key>, lease
-- ARGV[1]  fence mode (as in write.lua)
-- ARGV[2]  '1' if the write carries an idempotency key, else '0'
-- ARGV[3]  idempotency ttl in ms
-- ARGV[4]  number of resources n
-- ARGV[5]  position (1-based, in KEYS order) of the request's first resource: a repeat
--          is recognised by the key recorded under it
-- ARGV[6..] per resource: token, number of ops m, then m ops ('P', key, value or
--          'D', key, '')
-- Returns  {'ok', fence_1, ..., fence_n}        applied; fences after it
--          {'replayed', fence_1, ..., fence_n, by_1, ..., by_n}
--                                               every token may write and the key is
--                                               recorded: nothing applied; the recorded
--                                               fences (current if pruned) and the tokens
--                                               that applied it ('0' if pruned)
--          {'stale', i, fence_i, by_i}          resource i (the first stale in sorted
--                                               order) refused everything, key known or
--                                               not; by_i: the token that applied the key
--                                               under resource i, '0' if none
--          {'not_live', i, fence_i, by_i}       strict mode: resource i's token is not
--                                               its live lease; nothing applied
-- On a Redis Cluster every key must share a slot (the store checks before calling).
local mode, has_key, ttl_ms = ARGV[1], ARGV[2] == '1', ARGV[3]
local n, first = tonumber(ARGV[4]), tonumber(ARGV[5])
local fences, tokens, starts, counts = {}, {}, {}, {}
local at = 6
for w = 1, n do
  fences[w] = redis.call('GET', KEYS[4 * w - 3]) or '0'
  tokens[w] = ARGV[at]
  counts[w] = tonumber(ARGV[at + 1])
  starts[w] = at + 2
  at = at + 2 + 3 * counts[w]
end
local function applied_by(w)
  if not has_key then
    return '0'
  end
  local _, token = recorded(KEYS[4 * w - 1])
  return token or '0'
end
for w = 1, n do
  if not fence_admits(tokens[w], fences[w], mode) then
    return {'stale', w, fences[w], applied_by(w)}
  end
end
if mode == 'strict' then
  for w = 1, n do
    if not lease_live(KEYS[4 * w], tokens[w]) then
      return {'not_live', w, fences[w], applied_by(w)}
    end
  end
end
if has_key and recorded_fence(KEYS[4 * first - 1]) then
  local out = {'replayed'}
  for w = 1, n do
    out[#out + 1] = recorded_fence(KEYS[4 * w - 1]) or fences[w]
  end
  for w = 1, n do
    out[#out + 1] = applied_by(w)
  end
  return out
end
local out = {'ok'}
for w = 1, n do
  apply_ops(KEYS[4 * w - 2], tokens[w], ARGV, starts[w], counts[w])
  local new = advance_fence(KEYS[4 * w - 3], fences[w], tokens[w])
  if has_key then
    record_key(KEYS[4 * w - 1], new, tokens[w], ttl_ms)
  end
  out[#out + 1] = new
end
return out
