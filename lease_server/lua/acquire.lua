-- acquire.lua: grant a free or expired lease, replay a retried request, or report the holder;
-- a grant appends its events (eventlog.lua) in the same script (steps in lease.lua).
--
-- KEYS[1]  <prefix>:{<tag>}:lease    hash holder/token/request_id; PEXPIREAT = its expiry
-- KEYS[2]  <prefix>:{<tag>}:counter  last token issued, decimal; never expires or is deleted
-- KEYS[3..6] LOG, HEAD, COMPACT, OWED;  KEYS[7] DUE (one Redis only)
-- ARGV[1]  holder
-- ARGV[2]  ttl_ms
-- ARGV[3]  request_id ('' = none)
-- ARGV[4]  '1': token = max(counter + 1, Redis TIME in microseconds) (the clock floor)
--          '0': token = counter + 1 (dense; only for tests of the floor itself)
-- ARGV[5]  the resource, raw
-- ARGV[6]  maxlen of a per-resource log ('0': one shared log, pruned separately)
-- ARGV[7]  the events channel;  ARGV[8] '1' if the log is per resource
-- Returns  {outcome, token, ms, holder, revision}; token is a decimal string and
--          outcome 'granted'  (ms = ttl_ms; revision = that of its ACQUIRED),
--                  'replayed' (same non-empty request_id and holder; ms = time left),
--                  'held'     (someone else's unexpired lease; ms = time left);
--          revision '0' when nothing was appended.
--
-- A lease is live while its hash exists: Redis expires it by its own clock.
local seen = lease_seen(KEYS[1], ARGV[1], ARGV[3])
if seen then
  seen[5] = '0'
  return seen
end
local token, revision = lease_grant(KEYS[1], KEYS[2], {KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]},
                                    ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1', ARGV[5],
                                    ARGV[6], ARGV[7], ARGV[8])
return {'granted', token, tonumber(ARGV[2]), ARGV[1], revision}
