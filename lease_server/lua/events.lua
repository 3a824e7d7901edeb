-- events.lua: read the one shared log on one Redis (EventLog.events_after), atomically.
--
-- KEYS[1..3] LOG, HEAD, COMPACT  (eventlog.lua)
-- ARGV[1]  after: the reader's cursor (a revision)
-- ARGV[2]  resource: exact match ('' = use the prefix)
-- ARGV[3]  prefix: byte-wise prefix match ('' = every resource)
-- ARGV[4]  limit: at most this many events (>= 1)
-- ARGV[5]  scan: examine at most this many events (bounds the script's run time)
-- Returns  {head, compacted_through, {{revision, kind, resource, token, holder, ttl_ms}, ...}}
--
-- One script, so one consistent view: every event up to HEAD is there unless trimmed,
-- and COMPACT says how far. When the scan bound stops a filtered read short of HEAD,
-- the head returned is the last revision examined: the page covers (after, head].
local head = tonumber(redis.call('GET', KEYS[2]) or '0')
local compacted = redis.call('GET', KEYS[3]) or '0'
local resource, prefix = ARGV[2], ARGV[3]
local limit, budget = tonumber(ARGV[4]), tonumber(ARGV[5])
local out = {}
local reach = head
local start = tonumber(ARGV[1]) + 1
while start <= head do
  local batch = redis.call('XRANGE', KEYS[1], string.format('%d', start),
    string.format('%d', head), 'COUNT', 512)
  if #batch == 0 then
    break
  end
  for _, entry in ipairs(batch) do
    local revision = string.match(entry[1], '^(%d+)')
    local f = entry[2]  -- k kind r resource t token h holder l ttl_ms
    local r = f[4]
    local hit
    if resource ~= '' then
      hit = r == resource
    else
      hit = string.sub(r, 1, #prefix) == prefix
    end
    if hit then
      out[#out + 1] = {revision, f[2], r, f[6], f[8], f[10]}
      if #out >= limit then
        return {string.format('%d', head), compacted, out}
      end
    end
    start = tonumber(revision) + 1
    budget = budget - 1
    if budget <= 0 then
      reach = start - 1
      return {string.format('%d', reach), compacted, out}
    end
  end
end
return {string.format('%d', reach), compacted, out}
