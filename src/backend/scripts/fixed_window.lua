-- turnstile: fixed window, one decision.
-- KEYS[1]  hash {w = window start (µs since the Unix epoch), c = permits admitted in it}
-- ARGV     n (0 = probe for one permit, takes nothing), window (µs), limit
-- Reply    {1, now, reset_after, remaining} or {0, now, retry_after, 0}; times in µs, integers only.
-- Decides before it writes: a rejection changes nothing (except giving a key found without a TTL one).
local key = KEYS[1]
local n = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- fmod is exact on doubles, and every value here is an integer below 2^53.
local elapsed = math.fmod(now, window)
local start = now - elapsed
local reset = window - elapsed
local ttl_ms = math.ceil(reset / 1000)

local state = redis.call('HMGET', key, 'w', 'c')
local used = 0
if tonumber(state[1]) == start then
  used = tonumber(state[2]) or 0
end

local need = n
if need < 1 then need = 1 end
if used + need > limit or n == 0 then
  if state[1] and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIRE', key, ttl_ms)
  end
  if used + need > limit then
    return {0, now, reset, 0}
  end
  return {1, now, reset, limit - used}
end

redis.call('HSET', key, 'w', start, 'c', used + n)
redis.call('PEXPIRE', key, ttl_ms)
return {1, now, reset, limit - used - n}
