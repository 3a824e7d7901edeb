-- lease.lua: the steps of the lease scripts, shared by acquire(_many), renew_many and
-- release_many (prepended after decimal.lua, see fencing._redis.load_lua). Keys are a
-- resource's lease hash and counter (layout in fencing._redis); tokens are decimal strings.

-- The resource's live lease as this request sees it: nil when free (no hash: Redis
-- expired or nobody took it), else {'replayed' | 'held', token, ms_left, holder}.
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

-- Grant a free resource: the next token (counter + 1, or Redis time in microseconds
-- when that is larger and `floor` is true), the lease hash, its PEXPIRE. The counter is
-- bumped by INCR (exact 64-bit, errors rather than wrap at 2^63 - 1).
local function grant(klease, kcounter, holder, ttl_ms, request_id, floor)
  redis.call('INCR', kcounter)
  local token = redis.call('GET', kcounter)
  if floor then
    local now = now_us()
    if decimal_lt(token, now) then
      redis.call('SET', kcounter, now)
      token = now
    end
  end
  redis.call('HSET', klease, 'holder', holder, 'token', token, 'request_id', request_id)
  redis.call('PEXPIRE', klease, ttl_ms)
  return token
end

-- True if `token` (and `holder`, unless '') is the resource's live lease.
local function is_current(klease, token, holder)
  local lease = redis.call('HMGET', klease, 'holder', 'token')
  return lease[2] and lease[2] == token and (holder == '' or lease[1] == holder), lease[1]
end
