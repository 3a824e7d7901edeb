-- fenced.lua: the steps of a fenced write, shared by write.lua, write_many.lua and
-- write_batch.lua (prepended after decimal.lua, see serving.redis_db.load_lua). Keys are a
-- resource's (layout in serving.redis_db); tokens and fences are decimal strings.

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

-- What an idempotency key's write left: its fence and the token that applied it, or nil.
-- Records are '<fence>:<token>:<recorded_at_ms>'; older ones '<fence>:<recorded_at_ms>'
-- carry no token, and every mode but off leaves fence == token, so the fence stands in.
local function recorded(kidem)
  local seen = redis.call('GET', kidem)
  if not seen then
    return nil, nil
  end
  local fence, token = string.match(seen, '^(%d+):(%d+):%d+$')
  if fence then
    return fence, token
  end
  fence = string.match(seen, '^(%d+)')
  return fence, fence
end

-- The fence recorded with an idempotency key, or nil.
local function recorded_fence(kidem)
  local fence = recorded(kidem)
  return fence
end

-- Remember an idempotency key as '<fence>:<token>:<recorded_at_ms>' for ttl_ms.
local function record_key(kidem, fence, token, ttl_ms)
  redis.call('SET', kidem, fence .. ':' .. token .. ':' .. now_ms(), 'PX', ttl_ms)
end

-- One whole write, judged as guard.fence.judge does: the token against the fence, then
-- (strict) against the live lease, and only then the idempotency key; then apply,
-- advance, record. A stale token is refused whether or not its key is known.
-- Returns outcome ('ok' | 'replayed' | 'stale' | 'not_live'), fence, and the token that
-- applied the write's idempotency key ('0' when it carries none or it was never applied).
local function fenced_write(kfence, kdata, kidem, klease, token, mode, has_key, ttl_ms,
                            argv, at, n)
  local fence = redis.call('GET', kfence) or '0'
  local seen_fence, seen_token = nil, nil
  if has_key then
    seen_fence, seen_token = recorded(kidem)
  end
  if not fence_admits(token, fence, mode) then
    return 'stale', fence, seen_token or '0'
  end
  if mode == 'strict' and not lease_live(klease, token) then
    return 'not_live', fence, seen_token or '0'
  end
  if seen_fence then
    return 'replayed', seen_fence, seen_token
  end
  apply_ops(kdata, token, argv, at, n)
  local new = advance_fence(kfence, fence, token)
  if has_key then
    record_key(kidem, new, token, ttl_ms)
  end
  return 'ok', new, '0'
end
