-- turnstile: what every script starts with. The algorithm files that follow each define one local
-- function
--   algorithm(key, n, p1, p2, now) -> admitted, t, remaining, commit, repair, charge, held
-- deciding for `n` permits (n = 0: a probe for one permit that takes nothing) at `now` (µs since
-- the Unix epoch, from Redis's TIME) without writing anything. Admitted: t = reset_after and
-- remaining after taking n, and `commit()` writes the admission with its TTL. Rejected: t = the
-- exact retry-after. `repair()` gives the key a TTL if it exists without one; the runner calls it
-- whenever it does not commit (a commit sets the TTL anyway). `charge(k)` records k permits as
-- used at `now` without the limit check, whatever the decision was (a charge runner asks for a
-- probe's, which only reads), and returns reset_after and remaining after it, as an admission
-- would (remaining 0 while in debt); k = 0 only repairs. `held` (an admission of n > 0 only):
-- how long the n permits count, where that is less than reset_after (the exact sliding window's
-- log may hold older permits that expire later); nil where it is reset_after. All values are
-- integers below 2^53, exact in Lua's doubles; replies are integers only.

-- The most a window's count holds: a charge saturates here, as the in-memory count does (a
-- 32-bit field), far below 2^53, so that sums and the retry-after's divisions stay exact.
local MAX_COUNT = 4294967295

-- No state's time (µs since the Unix epoch) goes beyond this: 2^53, the last integer up to
-- which a double counts exactly (the year 2255). Only a charge gets near it.
local MAX_TIME = 9007199254740992

-- Keys this script found holding what no script writes (see `unreadable`): reported after the
-- reply's usual fields, so that the limiter counts them.
local unreadable = 0

-- `x` (a field as Redis returns it: a string, or false if missing) as a whole number in
-- [0, max], or nil if it is none: Lua's tonumber also reads "inf", "nan", "-5" and "1.5".
local function whole(x, max)
  local v = tonumber(x)
  if v == nil or v ~= v or v < 0 or v > max or v ~= math.floor(v) then return nil end
  return v
end

-- As `whole`, and at least 1 (a length, a capacity).
local function positive(x, max)
  local v = whole(x, max)
  if v and v >= 1 then return v end
  return nil
end

-- A key whose state cannot be read (another type, or a field no script writes: a window of
-- length 0, a negative count, a time past MAX_TIME) is read as no state, as the in-memory
-- StoreLimiter reads a value that cannot be its state: deleted here, so that the call decides
-- on a fresh key and its write (if any) starts the state afresh. Left as it was, it failed
-- every call (or a negative count admitted beyond the limit) until someone deleted it.
local function discard(key)
  redis.call('DEL', key)
  unreadable = unreadable + 1
end

-- How long an admission's permits count in every limit (µs from its `now`), which may be less
-- than the reset_after it replies (see once.lua); nil: that reset_after. Set by `single` to the
-- algorithm's `held`, and by chain.lua, which replies the longest reset_after, to the shortest
-- of its members' (each its `held`, or else its reset_after).
local counted_for = nil

-- `reply` with the count of unreadable keys appended when there were any.
local function reported(reply)
  if unreadable > 0 then reply[#reply + 1] = unreadable end
  return reply
end

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

-- The first boundary of the epoch-aligned grid of `window` at or after `t` (µs). A key without
-- state starts on that grid, so a key whose grid was rebased (see `window_grid`) must live until
-- then: gone at the end of its own window, the next call's epoch-aligned window could start
-- before that end and count afresh the permits admitted between the two. `t` itself on an
-- aligned grid.
local function grid_end(t, window)
  local r = math.fmod(t, window)
  if r == 0 then return t end
  return t + (window - r)
end

-- One algorithm on KEYS[1]; ARGV = n, p1, p2. Reply {1, now, reset_after, remaining} or
-- {0, now, retry_after, 0}, and the count of unreadable keys after them if there were any.
local function single(algorithm)
  local now = now_us()
  local n = tonumber(ARGV[1])
  local admitted, t, remaining, commit, repair, _, held =
    algorithm(KEYS[1], n, tonumber(ARGV[2]), tonumber(ARGV[3]), now)
  if not admitted or n == 0 then
    repair()
  else
    commit()
    counted_for = held
  end
  if not admitted then
    return reported({0, now, t, 0})
  end
  return reported({1, now, t, remaining})
end

-- A charge (see `charge` above) of ARGV[1] permits on KEYS[1]; ARGV = n, p1, p2. The state is
-- read by the algorithm's probe (n = 0), whose verdict is ignored: a charge is never refused.
-- Reply {1, now, reset_after, remaining}, an admission's shape.
local function charge_one(algorithm)
  local now = now_us()
  local _, _, _, _, _, charge =
    algorithm(KEYS[1], 0, tonumber(ARGV[2]), tonumber(ARGV[3]), now)
  local reset, remaining = charge(tonumber(ARGV[1]))
  return reported({1, now, reset, remaining})
end

-- The window holding `now` on a key's grid, for windows of `window` µs. Returns its start and
-- where the stored window lies: 0 if it is this window, 1 if it is the one just before, nil if
-- it is older still or there is none. `stored` is the stored window's start (nil: no state),
-- `len` its length (nil in a hash written before lengths were stored: read as `window`).
--
-- A key without state uses the epoch-aligned grid. A key with state continues its own grid:
-- windows of the stored length following on from the stored window. If the caller's length
-- differs (a limiter with other parameters meets the key), the grid is rebased the way the
-- in-memory `Grid::rebase` does at a reconfiguration, at the first call that meets it: the
-- window running now keeps its start when it is younger than the new length (then ends at
-- start + new length), and otherwise ends at the earlier of its old end and now + new length.
-- So no window change hands out a fresh window, and windows after it have the new length.
-- Only subtraction and fmod, both exact on integers below 2^53.
local function window_grid(stored, len, window, now)
  if stored == nil then
    return now - math.fmod(now, window), nil
  end
  len = len or window
  local finish = stored + len
  local start, age = stored, 0
  if now >= finish then
    -- A later window of the stored grid: its start is a whole number of lengths after `finish`.
    local since = now - finish
    start = now - math.fmod(since, len)
    if since < len then age = 1 else age = nil end
  end
  if len ~= window then
    local elapsed = now - start
    if elapsed < window then
      finish = start + window
    else
      finish = math.min(start + len, now + window)
    end
    start = finish - window
  end
  return start, age
end
