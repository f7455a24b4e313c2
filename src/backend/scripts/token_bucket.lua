-- Token bucket as GCRA. Key: string "<TAT>:<capacity>", the theoretical arrival time (µs) and
-- the capacity it was written under (time per permit × burst, µs). A bare "<TAT>" (written
-- before the capacity was stored) is read as written under the caller's capacity.
-- p1 = time per permit (µs), p2 = burst. The key lives exactly until TAT: once TAT has passed the
-- bucket is full, which is what a missing key means.
--
-- TAT alone is an absolute time, so a limiter with a longer time per permit meeting it would
-- read the same debt as fewer permits (a 10 % full bucket at 1/s read at 1/min is all but full
-- again). So a capacity other than the caller's is translated first, as the in-memory
-- `reconfigure` does (`Shape::translate`): the debt TAT − now, at most the stored capacity, is
-- scaled to the caller's capacity and rounded up (never looser). The bucket stays as full as
-- it was; the translation is written back even on a rejection or a probe, so that it happens
-- once, at the first call that meets the key.

-- ⌈a·b / c⌉ for integers 0 ≤ a ≤ c and b below 2^52, exact: a·b itself can pass 2^53, so
-- this is long multiplication modulo c, one bit of a at a time (q·c + r = the product so far,
-- r < c; every intermediate stays below 2^53).
local function mul_div_ceil(a, b, c)
  -- b = bq·c + br; b − br is a multiple of c, so the division is exact.
  local br = math.fmod(b, c)
  local bq = (b - br) / c
  local bits = {}
  while a > 0 do
    local bit = math.fmod(a, 2)
    bits[#bits + 1] = bit
    a = (a - bit) / 2
  end
  local q, r = 0, 0
  for i = #bits, 1, -1 do
    q, r = 2 * q, 2 * r
    if r >= c then q, r = q + 1, r - c end
    if bits[i] == 1 then
      q, r = q + bq, r + br
      if r >= c then q, r = q + 1, r - c end
    end
  end
  if r > 0 then q = q + 1 end
  return q
end

local function token_bucket(key, n, interval, burst, now)
  local capacity = interval * burst
  local stored = redis.pcall('GET', key)
  local tat, written = nil, capacity
  if type(stored) == 'table' then
    -- Another type (GET's error): no bucket.
    discard(key)
    stored = false
  elseif stored then
    local t, k = string.match(stored, '^(%d+):(%d+)$')
    if t then
      tat, written = whole(t, MAX_TIME), positive(k, MAX_TIME)
    else
      tat = whole(stored, MAX_TIME)
    end
    if not tat or not written then
      -- A time past MAX_TIME, a capacity of 0, or no number at all: no bucket.
      discard(key)
      stored, tat, written = false, nil, capacity
    end
  end
  local start = tat or 0
  if start < now then start = now end
  local translated = written ~= capacity
  -- The latest TAT a charge writes: a decision adds at most a capacity to it, so its sums stay
  -- at most MAX_TIME, exact, and the key's PXAT valid. At least 2^52 µs after the epoch (the
  -- year 2112) whatever the capacity: centuries of debt for the usual ones.
  local max_tat = MAX_TIME - capacity
  if translated then
    -- The debt at now scaled to our capacity, rounded up: at most the old capacity after
    -- admissions (so at most ours); beyond it only after a charge, whose whole capacities of
    -- debt scale exactly (the product held at max_tat, monotone where it is inexact).
    local debt = start - now
    if debt > 0 then
      local rest = math.fmod(debt, written)
      local whole = (debt - rest) / written
      start = math.min(now + whole * capacity + mul_div_ceil(rest, capacity, written),
        math.max(max_tat, now))
    end
  end
  local function set(value)
    -- At TAT the bucket is full (see `expire_at` in the prelude); a TAT already passed
    -- deletes the key, which is what a full bucket is.
    redis.call('SET', key, string.format('%d:%d', value, capacity), 'PXAT', expire_at(value))
  end
  local function repair()
    if translated then
      -- Keep the translation, so that later calls do not translate again from the old debt.
      if start > now then set(start) else redis.call('DEL', key) end
    elseif stored and redis.call('PTTL', key) == -1 then
      redis.call('PEXPIREAT', key, expire_at(start))
    end
  end
  -- Permits still owed for `owed` µs of TAT: ceil(owed / interval), at most the burst.
  local function left(owed)
    local used = math.ceil(owed / interval)
    if used < burst then return burst - used end
    return 0
  end
  -- TAT = max(TAT, now) + k·interval unchecked, held at max_tat (k·interval can pass 2^53: a
  -- double rounds it, never below a sum beyond max_tat, so the bound still applies).
  local function charge(k)
    if k == 0 then
      repair()
      return start - now, left(start - now)
    end
    local tat = math.min(start + k * interval, math.max(max_tat, start))
    set(tat)
    return tat - now, left(tat - now)
  end
  local need = n
  if need < 1 then need = 1 end
  local nxt = start + need * interval
  local ahead = nxt - now
  if ahead > capacity then
    return false, ahead - capacity, 0, nil, repair, charge
  end
  local owed = ahead
  if n == 0 then owed = start - now end
  local function commit()
    set(nxt)
  end
  return true, owed, left(owed), commit, repair, charge
end
