-- renew_many.lua: renew.lua for many leases in one script (a session's keepalive).
--
-- KEYS     the lease hash of each item
-- ARGV     per item: token (decimal), holder ('' skips the holder check), ttl_ms
-- Returns  {outcome_1, holder_1, ...}: 'renewed' with the lease's holder, or 'lost', ''
-- On a Redis Cluster every key of one call must share a slot: the backend groups items
-- by slot and sends one call per group.
local out = {}
for i = 1, #KEYS do
  local at = 3 * i - 2
  local current, holder = is_current(KEYS[i], ARGV[at], ARGV[at + 1])
  if current then
    redis.call('PEXPIRE', KEYS[i], ARGV[at + 2])
    out[#out + 1] = 'renewed'
    out[#out + 1] = holder
  else
    out[#out + 1] = 'lost'
    out[#out + 1] = ''
  end
end
return out
