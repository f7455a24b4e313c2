-- turnstile: token bucket as GCRA, one decision.
-- KEYS[1]  string: the theoretical arrival time (TAT, µs since the Unix epoch)
-- ARGV     n (0 = probe for one permit, takes nothing), interval (µs per permit), burst
-- Reply    {1, now, reset_after, remaining} or {0, now, retry_after, 0}; times in µs, integers only.
-- Decides before it writes: a rejection changes nothing (except giving a key found without a TTL one).
local key = KEYS[1]
local n = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local capacity = interval * burst

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local stored = redis.call('GET', key)
local tat = tonumber(stored) or 0
local start = tat
if start < now then start = now end

-- Permits still owed for `ahead` µs of TAT: ceil(ahead / interval), never more than the burst.
local function remaining(ahead)
  local used = math.ceil(ahead / interval)
  if used >= burst then return 0 end
  return burst - used
end

local need = n
if need < 1 then need = 1 end
local nxt = start + need * interval
local ahead = nxt - now
if ahead > capacity or n == 0 then
  if stored and redis.call('PTTL', key) == -1 then
    local ttl_ms = math.ceil((start - now) / 1000)
    if ttl_ms < 1 then ttl_ms = 1 end
    redis.call('PEXPIRE', key, ttl_ms)
  end
  if ahead > capacity then
    return {0, now, ahead - capacity, 0}
  end
  return {1, now, start - now, remaining(start - now)}
end

-- The key lives exactly as long as the bucket is not full: once TAT has passed it is a fresh key.
redis.call('SET', key, nxt, 'PX', math.ceil(ahead / 1000))
return {1, now, ahead, remaining(ahead)}
