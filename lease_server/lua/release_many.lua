-- release_many.lua: release.lua for many leases in one script.
--
-- KEYS     the lease hash of each item
-- ARGV[1]  pub/sub channel (<prefix>:released)
-- ARGV     then per item: token (decimal), holder ('' skips the check), the resource (raw)
-- Returns  {outcome_1, ...}: 'released' (and the resource published) or 'lost'
-- On a Redis Cluster every key of one call must share a slot (grouped by the backend).
local out = {}
for i = 1, #KEYS do
  local at = 3 * i - 1
  if is_current(KEYS[i], ARGV[at], ARGV[at + 1]) then
    redis.call('DEL', KEYS[i])
    redis.call('PUBLISH', ARGV[1], ARGV[at + 2])
    out[#out + 1] = 'released'
  else
    out[#out + 1] = 'lost'
  end
end
return out
