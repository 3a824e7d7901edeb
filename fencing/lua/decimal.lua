-- decimal.lua: prepended to every fencing script (serving.redis_db.load_lua, fencing.redis).
--
-- Tokens and fences travel and are stored as canonical decimal strings (no sign, no
-- leading zeros): Lua numbers are doubles, exact only up to 2^53, and tokens go up to
-- 2^63 - 1. decimal_lt(a, b) compares two such strings exactly: the shorter is
-- smaller; at equal length, the first differing byte decides (bytes, not the locale).
local function decimal_lt(a, b)
  if #a ~= #b then
    return #a < #b
  end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return false
end

-- Redis's clock (TIME) in microseconds since the epoch, as a decimal string.
local function now_us()
  local t = redis.call('TIME')
  return t[1] .. string.format('%06d', tonumber(t[2]))
end

-- Redis's clock in milliseconds since the epoch, as a decimal string.
local function now_ms()
  local t = redis.call('TIME')
  return t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
end
