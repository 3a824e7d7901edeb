-- acquire_many.lua: grant every resource or none (lease_server.leases.acquire_all).
--
-- KEYS     2 per resource, resources in sorted order: lease hash, counter
-- ARGV[1]  holder
-- ARGV[2]  ttl_ms
-- ARGV[3]  request_id ('' = none)
-- ARGV[4]  '1': the clock floor on (see acquire.lua), '0': off
-- Returns  {'granted', outcome_1, token_1, ms_1, ..., outcome_n, token_n, ms_n}
--            with outcome 'granted' (ms = ttl_ms) or 'replayed' (ms = time left), or
--          {'held', i, token, ms_left, holder}: resource i (the first held in sorted
--            order) is someone else's; nothing was granted.
-- On a Redis Cluster every key must share one slot (the backend checks before calling).
local n = #KEYS / 2
local seen = {}
for i = 1, n do
  local s = lease_seen(KEYS[2 * i - 1], ARGV[1], ARGV[3])
  if s and s[1] == 'held' then
    return {'held', i, s[2], s[3], s[4]}
  end
  seen[i] = s or false
end
local out = {'granted'}
for i = 1, n do
  if seen[i] then
    out[#out + 1] = 'replayed'
    out[#out + 1] = seen[i][2]
    out[#out + 1] = seen[i][3]
  else
    out[#out + 1] = 'granted'
    out[#out + 1] = grant(KEYS[2 * i - 1], KEYS[2 * i], ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1')
    out[#out + 1] = tonumber(ARGV[2])
  end
end
return out
