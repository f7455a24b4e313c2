-- Exact sliding window as a sorted-set log. Key: sorted set, one member per admitted permit, scored
-- by its EXPIRY (admission time + the window it was admitted under, µs); at most `limit` members
-- after every admission or charge. p1 = window (µs), p2 = limit. A permit counts while its expiry
-- is later than now. Scoring by expiry rather than admission time makes every admission keep the
-- window it was admitted with, as the in-memory log does after a `reconfigure`: a limiter with a
-- shorter window on the same keys still counts the older, longer admissions until they expire, and
-- one with a longer window does not stretch them. Nothing is trimmed on a rejection: the count is
-- of the members not yet expired.
local function sliding_window(key, n, window, limit, now)
  local now_s = string.format('%d', now)
  local inside = redis.pcall('ZCOUNT', key, '(' .. now_s, '+inf')
  -- The latest expiry in the log (0 if empty). After a shorter window it may be an older
  -- member's, later than any this limiter writes.
  local latest = 0
  if type(inside) == 'table' then
    -- Another type (ZCOUNT's error): no log.
    discard(key)
    inside = 0
  elseif inside > 0 then
    latest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    if not (latest <= MAX_TIME) then
      -- A member that never expires (+inf), or past MAX_TIME: no log.
      discard(key)
      inside, latest = 0, 0
    end
  end
  local function repair()
    if redis.call('PTTL', key) == -1 then
      -- Every member is gone by the latest expiry (see `expire_at` in the prelude); a key whose
      -- members have all expired goes at once.
      redis.call('PEXPIREAT', key, expire_at(latest))
    end
  end
  local expiry = now + window
  -- Adds k members expiring at `expiry`, after dropping the expired ones. Members are
  -- "<now>:<ordinal>", ordinals counted from the members not yet expired: within one
  -- microsecond the trim bound is the same, so the set only grows and those names are free,
  -- unless a charge trimmed the log within this microsecond (it keeps members by expiry, not by
  -- name). So ZADD NX: a name taken is never re-scored, and the next ordinal is tried instead.
  local function add(k)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now_s)
    local expiry_s = string.format('%d', expiry)
    local ordinal = inside
    while k > 0 do
      local batch = {'NX'}
      local j = 0
      while j < 512 and j < k do
        batch[#batch + 1] = expiry_s
        batch[#batch + 1] = now_s .. ':' .. string.format('%d', ordinal)
        ordinal = ordinal + 1
        j = j + 1
      end
      k = k - redis.call('ZADD', key, unpack(batch))
    end
    -- The key lives until its last member expires: an older member admitted under a longer
    -- window may outlive the ones just added.
    redis.call('PEXPIREAT', key, expire_at(math.max(latest, expiry)))
  end
  -- min(k, limit) members enter the log unchecked, which then keeps only its `limit` latest
  -- expiries (as the in-memory ring keeps N tickets): a member left out expires no later than
  -- every one kept, so the log counts as the whole log would, up to the limit. Full again when
  -- the latest member leaves, as after an admission.
  local function charge(k)
    if k == 0 then
      repair()
      return math.max(latest - now, 0), math.max(limit - inside, 0)
    end
    k = math.min(k, limit)
    add(k)
    if inside + k > limit then
      redis.call('ZREMRANGEBYRANK', key, 0, -(limit + 1))
    end
    return math.max(window, latest - now), math.max(limit - inside - k, 0)
  end
  local need = n
  if need < 1 then need = 1 end
  if inside + need > limit then
    -- The (inside + need - limit)-th earliest expiry must pass first.
    local first = redis.call('ZRANGEBYSCORE', key, '(' .. now_s, '+inf',
      'WITHSCORES', 'LIMIT', inside + need - limit - 1, 1)
    return false, tonumber(first[2]) - now, 0, nil, repair, charge
  end
  local function commit()
    add(n)
  end
  -- An admission is full again when the latest of its own permits and the older ones leaves. A
  -- probe adds none: the log is empty again when the latest member leaves (at once if none).
  -- The admission's own permits count for `window` only, however long the older ones stay.
  local reset, held
  if n == 0 then
    reset = math.max(latest - now, 0)
  else
    reset = math.max(window, latest - now)
    held = window
  end
  return true, reset, limit - inside - n, commit, repair, charge, held
end
