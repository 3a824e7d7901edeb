-- lease.lua: the steps of a grant, shared by acquire.lua and acquire_many.lua (prepended
-- after decimal.lua and eventlog.lua, see serving.redis_db.load_lua). Keys are a
-- resource's lease hash and counter and the event log's (eventlog.lua).

-- The resource's live lease as this request sees it: nil when free (no hash: Redis
-- expired it or nobody took it), else {'replayed' | 'held', token, ms_left, holder}.
local function lease_seen(klease, holder, request_id)
  local lease = redis.call('HMGET', klease, 'holder', 'token', 'request_id')
  if not lease[2] then
    return nil
  end
  local left = redis.call('PTTL', klease)
  if request_id ~= '' and lease[3] == request_id and lease[1] == holder then
    return {'replayed', lease[2], left, lease[1]}
  end
  return {'held', lease[2], left, lease[1]}
end

-- Grant a free resource and append its events: the EXPIRED owed to a lease that
-- expired unlogged first, then ACQUIRED. The token is counter + 1, or Redis's time in
-- microseconds when that is larger and `floor` is true (the clock floor); the counter
-- is bumped by INCR (exact 64-bit, errors rather than wrap at 2^63 - 1). `log` holds
-- the event log's keys {LOG, HEAD, COMPACT, OWED, DUE or nil}; `maxlen`, `channel`
-- and `per_resource` are the log's arguments. Returns token, revision of ACQUIRED.
local function lease_grant(klease, kcounter, log, holder, ttl_ms, request_id, floor, resource,
                           maxlen, channel, per_resource)
  local owed = redis.call('HGET', log[4], resource)
  if owed then
    local old_token, old_holder = owed_split(owed)
    log_append(log[1], log[2], 'expired', resource, old_token, old_holder, '0')
  end
  redis.call('INCR', kcounter)
  local token = redis.call('GET', kcounter)
  if floor then
    local now = now_us()
    if decimal_lt(token, now) then
      redis.call('SET', kcounter, now)
      token = now
    end
  end
  local expires = string.format('%d', tonumber(now_ms()) + tonumber(ttl_ms))
  redis.call('HSET', klease, 'holder', holder, 'token', token, 'request_id', request_id,
             'ttl_ms', ttl_ms)
  redis.call('PEXPIREAT', klease, expires)
  redis.call('HSET', log[4], resource, token .. ':' .. holder)
  if log[5] then
    redis.call('ZADD', log[5], expires, resource)
  end
  local revision = log_append(log[1], log[2], 'acquired', resource, token, holder, ttl_ms)
  log_trim(log[1], log[3], revision, maxlen)
  log_publish(channel, per_resource, revision, resource)
  return token, revision
end
