-- eventlog.lua: the event log, prepended to the scripts that change a lease
-- (serving.redis_db.load_lua(..., helpers=('eventlog',))).
--
-- The log's keys come after each script's own keys (lease_server/backends/redis.py
-- names them). On one Redis there is one log for every resource; on a Redis Cluster
-- each resource has its own, under the resource's hash tag (one slot per script):
--
--   LOG      stream; entry id '<revision>-0', fields k (kind), r (resource), t (token),
--            h (holder), l (ttl_ms); trimmed from the oldest
--   HEAD     the last revision appended (INCR; never deleted, so never reused)
--   COMPACT  the highest revision trimmed away ('0' or absent: none)
--   OWED     hash resource -> '<token>:<holder>': the lease whose end is not logged yet.
--            Redis expires a lease by itself (PEXPIREAT), and nothing runs when it does:
--            this is how a later script knows which token is owed an EXPIRED event.
--   DUE      (one Redis only) sorted set resource -> expiry of the owed lease, in ms
--            on Redis's clock: where the sweeper (expire.lua) looks.
--
-- Revisions are decimal strings; they stay far below 2^53, where Lua numbers are exact.

-- Append one event and return its revision.
local function log_append(log, head, kind, resource, token, holder, ttl_ms)
  local revision = string.format('%d', redis.call('INCR', head))
  redis.call('XADD', log, revision .. '-0',
    'k', kind, 'r', resource, 't', token, 'h', holder, 'l', ttl_ms)
  return revision
end

-- A per-resource log keeps its newest maxlen events ('0': all; one Redis prunes the one
-- log with prune.lua instead). Its revisions are dense, so what goes is <= head - maxlen.
local function log_trim(log, compacted, revision, maxlen)
  local keep = tonumber(maxlen)
  if keep <= 0 then
    return
  end
  local cut = tonumber(revision) - keep
  if cut > 0 and redis.call('XTRIM', log, 'MINID', string.format('%d', cut + 1)) > 0 then
    redis.call('SET', compacted, string.format('%d', cut))
  end
end

-- The owed lease's token and holder, from OWED's '<token>:<holder>'.
local function owed_split(value)
  return string.match(value, '^(%d+):(.*)$')
end

-- Tell listeners: on one Redis the new head, on a cluster '<revision>:<resource>'.
local function log_publish(channel, per_resource, revision, resource)
  if per_resource == '1' then
    redis.call('PUBLISH', channel, revision .. ':' .. resource)
  else
    redis.call('PUBLISH', channel, revision)
  end
end
