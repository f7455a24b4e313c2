-- turnstile: sliding window counter, one decision.
-- KEYS[1]  hash {w = current window start (µs since the Unix epoch), c = its count,
--          p = the count of the window before it}
-- ARGV     n (0 = probe for one permit, takes nothing), window (µs), limit
-- Reply    {1, now, reset_after, remaining} or {0, now, retry_after, 0}; times in µs, integers only.
-- Admits iff prev·(W − e) + (cur + n)·W ≤ limit·W, e the time elapsed in the current window. The
-- limiter checks limit·W ≤ 2^52, so every product here is an exact integer in a double.
-- Decides before it writes: a rejection changes nothing (except giving a key found without a TTL one).
local key = KEYS[1]
local n = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local elapsed = math.fmod(now, window)
local start = now - elapsed

local state = redis.call('HMGET', key, 'w', 'c', 'p')
local w = tonumber(state[1])
local prev, cur = 0, 0
if w == start then
  cur = tonumber(state[2]) or 0
  prev = tonumber(state[3]) or 0
elseif w == start - window then
  prev = tonumber(state[2]) or 0
end

local function fits(p, c, k, e)
  return p * (window - e) + (c + k) * window <= limit * window
end

local need = n
if need < 1 then need = 1 end
if not fits(prev, cur, need, elapsed) or n == 0 then
  if state[1] and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIRE', key, math.ceil((2 * window - elapsed) / 1000))
  end
  if not fits(prev, cur, need, elapsed) then
    -- Exact time until `need` fits with no further admissions.
    if cur + need <= limit and prev > 0 then
      -- Later in this window: prev·(W − e') ≤ (limit − cur − need)·W.
      local q = math.floor((limit - cur - need) * window / prev)
      if q > window then q = window end
      local first = window - q
      if first < window then
        local wait = first - elapsed
        if wait < 0 then wait = 0 end
        return {0, now, wait, 0}
      end
    end
    -- In the next window this count becomes prev; `first == W` means the window after that.
    local first = 0
    if cur > 0 then
      local q = math.floor((limit - need) * window / cur)
      if q > window then q = window end
      first = window - q
    end
    return {0, now, window - elapsed + first, 0}
  end
end

local taken = n
local weighted = 0
if prev > 0 then weighted = math.ceil(prev * (window - elapsed) / window) end
local reset = 0
if cur + taken > 0 then
  reset = 2 * window - elapsed
elseif prev > 0 then
  reset = window - elapsed
end
if n == 0 then
  return {1, now, reset, limit - cur - weighted}
end

redis.call('HSET', key, 'w', start, 'c', cur + n, 'p', prev)
-- After two windows both counts are history: the key can go.
redis.call('PEXPIRE', key, math.ceil((2 * window - elapsed) / 1000))
return {1, now, reset, limit - cur - n - weighted}
