-- acquire_many.lua: grant every resource or none (lease_server.leases.acquire_all),
-- each grant appending its events as acquire.lua's does (steps in lease.lua).
--
-- KEYS     first 2 per resource, resources in sorted order: lease hash, counter; then,
--          per resource, the `width` keys of its event log: LOG, HEAD, COMPACT, OWED
--          and, on one Redis, DUE (the shared log's keys, repeated for each resource)
-- ARGV[1]  holder
-- ARGV[2]  ttl_ms
-- ARGV[3]  request_id ('' = none)
-- ARGV[4]  '1': the clock floor on (see acquire.lua), '0': off
-- ARGV[5]  the number of resources n;  ARGV[6] width (5 on one Redis, 4 on a cluster)
-- ARGV[7..9] maxlen, the events channel, '1' if the log is per resource (as acquire.lua)
-- ARGV[10..] the resources, raw, in the order of KEYS
-- Returns  {'granted', outcome_1, token_1, ms_1, revision_1, ...} with outcome 'granted'
--            (ms = ttl_ms) or 'replayed' (ms = time left; revision '0'), or
--          {'held', i, token, ms_left, holder}: resource i (the first held in sorted
--            order) is someone else's; nothing was granted or appended.
-- On a Redis Cluster every key must share one slot (the backend checks before calling).
local n, width = tonumber(ARGV[5]), tonumber(ARGV[6])
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
    out[#out + 1] = '0'
  else
    local at = 2 * n + (i - 1) * width
    local log = {KEYS[at + 1], KEYS[at + 2], KEYS[at + 3], KEYS[at + 4]}
    if width == 5 then
      log[5] = KEYS[at + 5]
    end
    local token, revision = lease_grant(KEYS[2 * i - 1], KEYS[2 * i], log, ARGV[1], ARGV[2],
                                        ARGV[3], ARGV[4] == '1', ARGV[9 + i], ARGV[7],
                                        ARGV[8], ARGV[9])
    out[#out + 1] = 'granted'
    out[#out + 1] = token
    out[#out + 1] = tonumber(ARGV[2])
    out[#out + 1] = revision
  end
end
return out
