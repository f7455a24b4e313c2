-- Sliding window counter. Key: hash {w = current window start (µs), c = its count, p = the count
-- of the window before it}. p1 = window (µs), p2 = limit.
-- Admits iff prev·(W − e) + (cur + n)·W ≤ limit·W, e the time elapsed in the current window. The
-- limiter checks limit·W ≤ 2^52, so every product here is an exact integer in a double.
local function sliding_counter(key, n, window, limit, now)
  local elapsed = math.fmod(now, window)
  local start = now - elapsed
  -- At the end of the next window both counts are history (see `expire_at` in the prelude).
  local expires = expire_at(start + 2 * window)
  local state = redis.call('HMGET', key, 'w', 'c', 'p')
  local w = tonumber(state[1])
  local prev, cur = 0, 0
  if w == start then
    cur = tonumber(state[2]) or 0
    prev = tonumber(state[3]) or 0
  elseif w == start - window then
    prev = tonumber(state[2]) or 0
  end
  local function repair()
    if state[1] and redis.call('PTTL', key) == -1 then
      redis.call('PEXPIREAT', key, expires)
    end
  end
  local need = n
  if need < 1 then need = 1 end
  if prev * (window - elapsed) + (cur + need) * window > limit * window then
    -- Exact time until `need` fits with no further admissions.
    if cur + need <= limit and prev > 0 then
      -- Later in this window: prev·(W − e') ≤ (limit − cur − need)·W.
      local q = math.floor((limit - cur - need) * window / prev)
      if q > window then q = window end
      local first = window - q
      if first < window then
        local wait = first - elapsed
        if wait < 0 then wait = 0 end
        return false, wait, 0, nil, repair
      end
    end
    -- In the next window this count becomes prev; `first == W` means the window after that.
    local first = 0
    if cur > 0 then
      local q = math.floor((limit - need) * window / cur)
      if q > window then q = window end
      first = window - q
    end
    return false, window - elapsed + first, 0, nil, repair
  end
  local weighted = 0
  if prev > 0 then weighted = math.ceil(prev * (window - elapsed) / window) end
  local reset = 0
  if cur + n > 0 then
    reset = 2 * window - elapsed
  elseif prev > 0 then
    reset = window - elapsed
  end
  local function commit()
    redis.call('HSET', key, 'w', start, 'c', cur + n, 'p', prev)
    -- After two windows both counts are history: the key can go.
    redis.call('PEXPIREAT', key, expires)
  end
  return true, reset, limit - cur - n - weighted, commit, repair
end
