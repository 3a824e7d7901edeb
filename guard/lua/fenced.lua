-- fenced.lua: the steps of a fenced write, shared by write.lua, write_many.lua and
-- write_batch.lua (prepended after decimal.lua, see fencing._redis.load_lua). Keys are a
-- resource's (layout in fencing._redis); tokens and fences are decimal strings.

-- True if a write with `token` passes the fence rule in `mode` (guard.fence.admit):
-- every mode but 'off' rejects token < fence.
local function fence_admits(token, fence, mode)
  return mode == 'off' or not decimal_lt(token, fence)
end

-- True if `token` is the resource's live lease: the lease backend's hash, which Redis
-- expires itself, carries it.
local function lease_live(klease, token)
  return redis.call('HGET', klease, 'token') == token
end

-- Apply `n` ops read from `argv` starting at `at`, each 'P', key, value (a put) or
-- 'D', key, '' (a delete); a put stores '<token>:<value>'.
local function apply_ops(kdata, token, argv, at, n)
  for i = 0, n - 1 do
    local p = at + 3 * i
    if argv[p] == 'P' then
      redis.call('HSET', kdata, argv[p + 1], token .. ':' .. argv[p + 2])
    else
      redis.call('HDEL', kdata, argv[p + 1])
    end
  end
end

-- Advance the fence to max(fence, token); return the new fence.
local function advance_fence(kfence, fence, token)
  if decimal_lt(fence, token) then
    redis.call('SET', kfence, token)
    return token
  end
  return fence
end

-- The fence recorded with an idempotency key, or nil.
local function recorded_fence(kidem)
  local seen = redis.call('GET', kidem)
  if seen then
    return string.match(seen, '^(%d+)')
  end
  return nil
end

-- Remember an idempotency key as '<fence>:<recorded_at_ms>' for ttl_ms.
local function record_key(kidem, fence, ttl_ms)
  redis.call('SET', kidem, fence .. ':' .. now_ms(), 'PX', ttl_ms)
end

-- One whole write: replay a recorded key, judge, apply, advance, record.
-- Returns outcome ('ok' | 'replayed' | 'stale' | 'not_live'), fence.
local function fenced_write(kfence, kdata, kidem, klease, token, mode, has_key, ttl_ms,
                            argv, at, n)
  local fence = redis.call('GET', kfence) or '0'
  if has_key then
    local seen = recorded_fence(kidem)
    if seen then
      return 'replayed', seen
    end
  end
  if not fence_admits(token, fence, mode) then
    return 'stale', fence
  end
  if mode == 'strict' and not lease_live(klease, token) then
    return 'not_live', fence
  end
  apply_ops(kdata, token, argv, at, n)
  local new = advance_fence(kfence, fence, token)
  if has_key then
    record_key(kidem, new, ttl_ms)
  end
  return 'ok', new
end
