-- turnstile: the wrapper of an `acquire` call's scripts, after the prelude (and the algorithm or
-- chain files); the decisions of `try_acquire` run without it.
--
-- One attempt of an `acquire` call, which tries again after a rejection (RedisLimiter::acquire_n):
-- KEYS[#KEYS] is the call's own record, `prefix:{subject}:acq.<call id>` (the subject's hash tag,
-- so the subject's slot), taken off before `decide` (a runner: `single`, or the chain's) reads the
-- others. An attempt that timed out may have run late and admitted while its caller was told to
-- wait (by a fallback that rejected): the call's next attempt then finds the record and answers
-- the recorded admission instead of taking the permits again. An admission writes the record,
-- "now:reset_after:remaining", expiring with the state's reset (its permits stop counting then,
-- so a second charge could no longer matter). One record per call, so that concurrent calls on
-- one subject never overwrite each other's.
local function once(decide)
  local record = table.remove(KEYS)
  local held = redis.pcall('GET', record)
  if type(held) == 'string' then
    local f = {}
    for field in string.gmatch(held, '[^:]+') do f[#f + 1] = field end
    local at, reset = whole(f[1], MAX_TIME), whole(f[2], MAX_TIME)
    local remaining = whole(f[3], MAX_COUNT)
    if #f == 3 and at and reset and remaining then
      return {1, at, reset, remaining}
    end
  end
  local reply = decide()
  if reply[1] == 1 and tonumber(ARGV[1]) > 0 then
    local value = string.format('%d:%d:%d', reply[2], reply[3], reply[4])
    redis.call('SET', record, value, 'PXAT', expire_at(reply[2] + math.max(reply[3], 1000)))
  end
  return reply
end
