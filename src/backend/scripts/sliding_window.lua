-- Exact sliding window as a sorted-set log. Key: sorted set, one member per admitted permit,
-- scored by its admission time (µs); at most `limit` members after every admission.
-- p1 = window (µs), p2 = limit. A permit admitted at t counts while t + window > now. Nothing is
-- trimmed on a rejection: the count is of the members still inside the window.
local function sliding_window(key, n, window, limit, now)
  -- Every member inside leaves by now + window (see `expire_at` in the prelude).
  local expires = expire_at(now + window)
  local floor = string.format('%d', now - window)
  local inside = redis.call('ZCOUNT', key, '(' .. floor, '+inf')
  local function repair()
    if redis.call('PTTL', key) == -1 then
      redis.call('PEXPIREAT', key, expires)
    end
  end
  local need = n
  if need < 1 then need = 1 end
  if inside + need > limit then
    -- The (inside + need - limit)-th oldest permit inside the window must expire first.
    local oldest = redis.call('ZRANGEBYSCORE', key, '(' .. floor, '+inf',
      'WITHSCORES', 'LIMIT', inside + need - limit - 1, 1)
    return false, tonumber(oldest[2]) + window - now, 0, nil, repair
  end
  -- Members are "<now>:<ordinal>", ordinals counted from the members still inside: within one
  -- microsecond the trim bound is the same, so the set only grows and members never collide.
  local function commit()
    redis.call('ZREMRANGEBYSCORE', key, '-inf', floor)
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
    redis.call('PEXPIREAT', key, expires)
  end
  -- An admission's newest permit is its own, which leaves in one window. A probe adds none: the
  -- log is empty again when the newest permit inside leaves (at once if there is none).
  local reset = window
  if n == 0 then
    reset = 0
    if inside > 0 then
      local newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', '(' .. floor,
        'WITHSCORES', 'LIMIT', 0, 1)
      reset = tonumber(newest[2]) + window - now
    end
  end
  return true, reset, limit - inside - n, commit, repair
end
