-- Fixed window. Key: hash {w = window start (µs), c = permits admitted in it}.
-- p1 = window (µs), p2 = limit. Windows are aligned to the Unix epoch.
local function fixed_window(key, n, window, limit, now)
  -- fmod is exact on doubles, and every value here is an integer below 2^53.
  local elapsed = math.fmod(now, window)
  local start = now - elapsed
  local reset = window - elapsed
  -- The key expires at the window's end, in absolute ms (see `expire_at` in the prelude).
  local expires = expire_at(start + window)
  local state = redis.call('HMGET', key, 'w', 'c')
  local used = 0
  if tonumber(state[1]) == start then
    used = tonumber(state[2]) or 0
  end
  local need = n
  if need < 1 then need = 1 end
  local function repair()
    if state[1] and redis.call('PTTL', key) == -1 then
      redis.call('PEXPIREAT', key, expires)
    end
  end
  if used + need > limit then
    return false, reset, 0, nil, repair
  end
  local function commit()
    redis.call('HSET', key, 'w', start, 'c', used + n)
    redis.call('PEXPIREAT', key, expires)
  end
  return true, reset, limit - used - n, commit, repair
end
