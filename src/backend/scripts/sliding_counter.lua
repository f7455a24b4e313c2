-- Sliding window counter. Key: hash {w = the current window's start (µs), l = its length (µs),
-- c = its count, p = the count of the window before it}. p1 = window (µs), p2 = limit.
-- Admits iff prev·(W − e) + (cur + n)·W ≤ limit·W, e the time elapsed in the current window. The
-- limiter checks limit·W ≤ 2^52, so every product here is an exact integer in a double.
-- Windows follow the key's own grid, rebased when the caller's window differs from the stored
-- length (see `window_grid` in the prelude): both counts are kept, and the previous window's is
-- weighted over the new length, as the in-memory `reconfigure` does.
local function sliding_counter(key, n, window, limit, now)
  local state = redis.pcall('HMGET', key, 'w', 'l', 'c', 'p')
  if state.err or (state[1] and (not whole(state[1], MAX_TIME)
      or (state[2] and not positive(state[2], MAX_TIME))
      or (state[3] and not whole(state[3], MAX_COUNT))
      or (state[4] and not whole(state[4], MAX_COUNT)))) then
    discard(key)
    state = {false, false, false, false}
  end
  local stored, len = tonumber(state[1]), tonumber(state[2])
  local start, age = window_grid(stored, len, window, now)
  local elapsed = now - start
  -- At the end of the next window both counts are history (see `expire_at` in the prelude).
  local expires = expire_at(start + 2 * window)
  local prev, cur = 0, 0
  if age == 0 then
    cur = tonumber(state[3]) or 0
    prev = tonumber(state[4]) or 0
  elseif age == 1 then
    prev = tonumber(state[3]) or 0
  end
  local function write(count)
    redis.call('HSET', key, 'w', start, 'l', window, 'c', count, 'p', prev)
    redis.call('PEXPIREAT', key, expires)
  end
  local function repair()
    if stored and len and len ~= window then
      -- Stored under another length: keep the rebased grid now (as the fixed window does).
      write(cur)
    elseif stored and redis.call('PTTL', key) == -1 then
      redis.call('PEXPIREAT', key, expires)
    end
  end
  -- Reset_after and remaining with `count` in the current window: full again once both counts
  -- are history. A count in debt makes the weighted product inexact only where it is far
  -- above limit·W (at least 2^53, limit·W being at most 2^52): remaining is 0 either way.
  local function report(count)
    local weighted = 0
    if prev > 0 then weighted = math.ceil(prev * (window - elapsed) / window) end
    local reset = 0
    if count > 0 then
      reset = 2 * window - elapsed
    elseif prev > 0 then
      reset = window - elapsed
    end
    return reset, math.max(limit - count - weighted, 0)
  end
  -- The current count grows by k unchecked, up to MAX_COUNT (so prev, a count too, stays
  -- there): it weighs fully to the window's end, then fades over the next.
  local function charge(k)
    local count = math.min(cur + k, MAX_COUNT)
    if k == 0 then
      repair()
    else
      write(count)
    end
    return report(count)
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
        return false, wait, 0, nil, repair, charge
      end
    end
    -- In the next window this count becomes prev; `first == W` means the window after that.
    local first = 0
    if cur > 0 then
      local q = math.floor((limit - need) * window / cur)
      if q > window then q = window end
      first = window - q
    end
    return false, window - elapsed + first, 0, nil, repair, charge
  end
  local reset, remaining = report(cur + n)
  local function commit()
    -- After two windows both counts are history: the key can go.
    write(cur + n)
  end
  return true, reset, remaining, commit, repair, charge
end
