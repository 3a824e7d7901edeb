-- prune.lua: keep the newest ARGV[1] events of the one shared log (EventLog.prune_events).
--
-- KEYS[1..3] LOG, HEAD, COMPACT  (eventlog.lua)
-- Returns  how many events were dropped. COMPACT is raised in the same step.
local cut = tonumber(redis.call('GET', KEYS[2]) or '0') - tonumber(ARGV[1])
if cut <= 0 then
  return 0
end
local dropped = redis.call('XTRIM', KEYS[1], 'MINID', string.format('%d', cut + 1))
if dropped > 0 and tonumber(redis.call('GET', KEYS[3]) or '0') < cut then
  redis.call('SET', KEYS[3], string.format('%d', cut))
end
return dropped
