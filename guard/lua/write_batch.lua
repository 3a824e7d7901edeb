-- write_batch.lua: many independent writes in one script, each judged and applied as
-- write.lua would at its place in the batch (a later write sees what earlier ones left).
--
-- KEYS     4 per write, in order: fence, data, idem:<key>, lease of the write's resource
-- ARGV[1]  fence mode (as in write.lua)
-- ARGV[2]  idempotency ttl in ms
-- ARGV[3]  number of writes n; then per write:
--          token, '1'|'0' (has an idempotency key), number of ops m, then m ops
--          ('P', key, value or 'D', key, '')
-- Returns  {outcome_1, fence_1, by_1, ..., outcome_n, fence_n, by_n} (as in write.lua)
--
-- On a Redis Cluster every key of one call must share a slot: the store groups writes
-- by slot and sends one call per group.
local mode, ttl_ms, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out = {}
local at = 4
for w = 0, n - 1 do
  local k = 4 * w
  local m = tonumber(ARGV[at + 2])
  local outcome, fence, by = fenced_write(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4],
                                          ARGV[at], mode, ARGV[at + 1] == '1', ttl_ms,
                                          ARGV, at + 3, m)
  out[#out + 1] = outcome
  out[#out + 1] = fence
  out[#out + 1] = by
  at = at + 3 + 3 * m
end
return out
