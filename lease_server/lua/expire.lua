-- expire.lua: the sweeper's step on one Redis: log the expiry of leases Redis let expire.
--
-- KEYS[1..4] LOG, HEAD, OWED, DUE  (eventlog.lua; the one shared log)
-- ARGV[1]  at most this many leases
-- ARGV[2]  the events channel
-- Returns  {{revision, resource, token, holder}, ...} in revision order: the EXPIRED
--          events appended (none when nothing was due or another server logged them).
--
-- A lease whose DUE time passed on Redis's clock is dead (its hash was given the same
-- expiry with PEXPIREAT, so no later script sees it). Its OWED entry is removed in the
-- same step as its EXPIRED is appended; an acquire that takes it over first does the
-- same, so each expiry is logged once, whichever comes first and however many sweep.
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
local last = nil
for _, resource in ipairs(due) do
  redis.call('ZREM', KEYS[4], resource)
  local owed = redis.call('HGET', KEYS[3], resource)
  if owed then
    redis.call('HDEL', KEYS[3], resource)
    local token, holder = owed_split(owed)
    last = log_append(KEYS[1], KEYS[2], 'expired', resource, token, holder, '0')
    out[#out + 1] = {last, resource, token, holder}
  end
end
if last then
  log_publish(ARGV[2], '0', last, '')
end
return out
