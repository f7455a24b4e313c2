-- Token bucket as GCRA. Key: string, the theoretical arrival time (TAT, µs).
-- p1 = time per permit (µs), p2 = burst. The key lives exactly until TAT: once TAT has passed the
-- bucket is full, which is what a missing key means.
local function token_bucket(key, n, interval, burst, now)
  local capacity = interval * burst
  local stored = redis.call('GET', key)
  local start = tonumber(stored) or 0
  if start < now then start = now end
  local function repair()
    if stored and redis.call('PTTL', key) == -1 then
      -- At TAT the bucket is full (see `expire_at` in the prelude); a TAT already passed
      -- deletes the key, which is what a full bucket is.
      redis.call('PEXPIREAT', key, expire_at(start))
    end
  end
  local need = n
  if need < 1 then need = 1 end
  local nxt = start + need * interval
  local ahead = nxt - now
  if ahead > capacity then
    return false, ahead - capacity, 0, nil, repair
  end
  -- Permits still owed for `owed` µs of TAT: ceil(owed / interval), at most the burst.
  local owed = ahead
  if n == 0 then owed = start - now end
  local used = math.ceil(owed / interval)
  local remaining = 0
  if used < burst then remaining = burst - used end
  local function commit()
    redis.call('SET', key, nxt, 'PXAT', expire_at(nxt))
  end
  return true, owed, remaining, commit, repair
end
