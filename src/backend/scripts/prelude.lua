-- turnstile: what every script starts with. The algorithm files that follow each define one local
-- function
--   algorithm(key, n, p1, p2, now) -> admitted, t, remaining, commit, repair
-- deciding for `n` permits (n = 0: a probe for one permit that takes nothing) at `now` (µs since
-- the Unix epoch, from Redis's TIME) without writing anything. Admitted: t = reset_after and
-- remaining after taking n, and `commit()` writes the admission with its TTL. Rejected: t = the
-- exact retry-after. `repair()` gives the key a TTL if it exists without one; the runner calls it
-- whenever it does not commit (a commit sets the TTL anyway). All values are integers below
-- 2^53, exact in Lua's doubles; replies are integers only.

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The expiry time (ms since the Unix epoch, for PEXPIREAT and SET's PXAT) of state that equals
-- a missing key's from `t` µs on, rounded up. Absolute rather than a TTL: Redis 7.0 adds a
-- PEXPIRE's TTL to its millisecond clock and then checks the sum against that clock read again,
-- so `PEXPIRE key 1` (the last millisecond of a window asks for it) deletes the key at once when
-- the clock ticks between the two reads, about 1 call in 30,000, losing the admission just
-- written. An absolute time is deleted at once only when it has truly passed.
local function expire_at(t)
  return math.ceil(t / 1000)
end

-- One algorithm on KEYS[1]; ARGV = n, p1, p2. Reply {1, now, reset_after, remaining} or
-- {0, now, retry_after, 0}.
local function single(algorithm)
  local now = now_us()
  local n = tonumber(ARGV[1])
  local admitted, t, remaining, commit, repair =
    algorithm(KEYS[1], n, tonumber(ARGV[2]), tonumber(ARGV[3]), now)
  if not admitted or n == 0 then
    repair()
  else
    commit()
  end
  if not admitted then
    return {0, now, t, 0}
  end
  return {1, now, t, remaining}
end
