-- turnstile: exact sliding window as a sorted-set log, one decision.
-- KEYS[1]  sorted set: one member per admitted permit, scored by its admission time (µs since the
--          Unix epoch). Holds at most `limit` members after every admission.
-- ARGV     n (0 = probe for one permit, takes nothing), window (µs), limit
-- Reply    {1, now, reset_after, remaining} or {0, now, retry_after, 0}; times in µs, integers only.
-- Decides before it writes: a rejection changes nothing (no trimming either; except giving a key
-- found without a TTL one). A permit admitted at t counts while t + window > now.
local key = KEYS[1]
local n = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local ttl_ms = math.ceil(window / 1000)

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local floor = now - window

-- Permits still inside the window: scores in (now - window, +inf).
local inside = redis.call('ZCOUNT', key, '(' .. string.format('%d', floor), '+inf')

local need = n
if need < 1 then need = 1 end
if inside + need > limit or n == 0 then
  if redis.call('PTTL', key) == -1 then
    redis.call('PEXPIRE', key, ttl_ms)
  end
  if inside + need > limit then
    -- The (inside + need - limit)-th oldest permit inside the window must expire first.
    local skip = inside + need - limit - 1
    local oldest = redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%d', floor), '+inf',
      'WITHSCORES', 'LIMIT', skip, 1)
    return {0, now, tonumber(oldest[2]) + window - now, 0}
  end
  return {1, now, window, limit - inside}
end

-- Admit: drop what has left the window, then log one member per permit. A member is
-- "<now>:<ordinal>", with ordinals counted from the members still inside: within one microsecond
-- the set only grows (the trim bound is the same), so members never collide.
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', floor))
local now_s = string.format('%d', now)
local i = 0
while i < n do
  local batch = {}
  local j = 0
  while j < 512 and i < n do
    batch[#batch + 1] = now_s
    batch[#batch + 1] = now_s .. ':' .. string.format('%d', inside + i)
    i = i + 1
    j = j + 1
  end
  redis.call('ZADD', key, unpack(batch))
end
redis.call('PEXPIRE', key, ttl_ms)
return {1, now, window, limit - inside - n}
