-- Fixed window. Key: hash {w = the current window's start (µs), l = its length (µs), c =
-- permits admitted in it, b = when the key was created (µs, this script's `now`)}. p1 = window
-- (µs), p2 = limit. `b` is written with the key's first state only and kept by every later write,
-- so that give_back.lua can tell the key that counted an admission from one created again since
-- (after a reset's DEL, an expiry or an eviction, or a discard below) in the same window. A key without state starts on the grid
-- aligned to the Unix epoch; a key with state keeps its own grid, rebased when the caller's
-- window differs from the stored length (see `window_grid` in the prelude), so that a limiter
-- with another window keeps the count as the in-memory `reconfigure` does. A new limit simply
-- applies to the count kept (a count above a lowered limit admits nothing until the window ends).
local function fixed_window(key, n, window, limit, now)
  local state = redis.pcall('HMGET', key, 'w', 'l', 'c')
  if state.err or (state[1] and (not whole(state[1], MAX_TIME)
      or (state[2] and not positive(state[2], MAX_TIME))
      or (state[3] and not whole(state[3], MAX_COUNT)))) then
    discard(key)
    state = {false, false, false}
  end
  local stored, len = tonumber(state[1]), tonumber(state[2])
  local start, age = window_grid(stored, len, window, now)
  local used = 0
  if age == 0 then
    used = tonumber(state[3]) or 0
  end
  local reset = start + window - now
  -- The key expires at the window's end, in absolute ms (see `expire_at` in the prelude), or
  -- at the next boundary of the epoch-aligned grid if the key's grid was rebased (`grid_end`).
  local expires = expire_at(grid_end(start + window, window))
  local need = n
  if need < 1 then need = 1 end
  local function write(count)
    if stored then
      redis.call('HSET', key, 'w', start, 'l', window, 'c', count)
    else
      redis.call('HSET', key, 'w', start, 'l', window, 'c', count, 'b', now)
    end
    redis.call('PEXPIREAT', key, expires)
  end
  local function repair()
    if stored and len and len ~= window then
      -- Stored under another length: keep the rebased grid now, or every later call would
      -- rebase again from the old one, at its own time, and move the window's end.
      write(used)
    elseif stored and redis.call('PTTL', key) == -1 then
      redis.call('PEXPIREAT', key, expires)
    end
  end
  -- The count grows by k unchecked, up to MAX_COUNT: the window's end clears any debt.
  local function charge(k)
    if k == 0 then
      repair()
    else
      write(math.min(used + k, MAX_COUNT))
    end
    return reset, math.max(limit - used - k, 0)
  end
  if used + need > limit then
    return false, reset, 0, nil, repair, charge
  end
  local function commit()
    write(used + n)
  end
  return true, reset, limit - used - n, commit, repair, charge
end
