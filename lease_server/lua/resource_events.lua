-- resource_events.lua: read one resource's own log on a Redis Cluster, after logging
-- its expiry if it is owed one.
--
-- KEYS[1]  <prefix>:{<tag>}:lease    the resource's lease hash
-- KEYS[2..5] LOG, HEAD, COMPACT, OWED of the resource  (eventlog.lua; its own slot)
-- ARGV[1]  after: the reader's cursor (a revision of this resource's log)
-- ARGV[2]  limit (>= 1)
-- ARGV[3]  the resource, raw
-- ARGV[4]  the events channel
-- ARGV[5]  maxlen of the resource's log
-- Returns  {head, compacted_through, {{revision, kind, resource, token, holder, ttl_ms}, ...},
--           revision of an EXPIRED appended now or '0'}
--
-- A cluster has no sweeper (no script can see every resource's keys): a lease that
-- Redis expired is logged by the first of its takeover (acquire.lua) and this read,
-- both conditional on OWED, so exactly once; a reader can never see the log without it.
local resource = ARGV[3]
local settled = '0'
local owed = redis.call('HGET', KEYS[5], resource)
if owed then
  local token, holder = owed_split(owed)
  if redis.call('HGET', KEYS[1], 'token') ~= token then
    redis.call('HDEL', KEYS[5], resource)
    settled = log_append(KEYS[2], KEYS[3], 'expired', resource, token, holder, '0')
    log_trim(KEYS[2], KEYS[4], settled, ARGV[5])
    log_publish(ARGV[4], '1', settled, resource)
  end
end
local head = redis.call('GET', KEYS[3]) or '0'
local compacted = redis.call('GET', KEYS[4]) or '0'
local out = {}
local after = tonumber(ARGV[1])
if after < tonumber(head) then
  local batch = redis.call('XRANGE', KEYS[2], string.format('%d', after + 1), head,
    'COUNT', tonumber(ARGV[2]))
  for _, entry in ipairs(batch) do
    local f = entry[2]
    out[#out + 1] = {string.match(entry[1], '^(%d+)'), f[2], f[4], f[6], f[8], f[10]}
  end
end
return {head, compacted, out, settled}
