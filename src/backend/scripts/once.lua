-- turnstile: the wrapper of an `acquire` call's scripts, after the prelude (and the algorithm or
-- chain files); the decisions of `try_acquire` run without it.
--
-- One attempt of an `acquire` call, which tries again after a rejection (RedisLimiter::acquire_n):
-- KEYS[#KEYS] is the subject's record of the last acquire call Redis admitted for it, ARGV[#ARGV]
-- the id every attempt of this call carries; both are taken off before `decide` (a runner:
-- `single`, or the chain's) reads the others. An attempt that timed out may have run late and
-- admitted while its caller was told to wait (by a fallback that rejected): the call's next
-- attempt then finds its id in the record and answers the recorded admission instead of taking
-- the permits again. An admission writes the record, "id:now:reset_after:remaining", expiring
-- with the state's reset (its permits stop counting then, so a second charge could no longer
-- matter); one record per subject, the latest acquire admitted.
local function once(decide)
  local record = table.remove(KEYS)
  local id = table.remove(ARGV)
  local held = redis.pcall('GET', record)
  if type(held) == 'string' then
    local f = {}
    for field in string.gmatch(held, '[^:]+') do f[#f + 1] = field end
    local at, reset = whole(f[2], MAX_TIME), whole(f[3], MAX_TIME)
    local remaining = whole(f[4], MAX_COUNT)
    if #f == 4 and f[1] == id and at and reset and remaining then
      return {1, at, reset, remaining}
    end
  end
  local reply = decide()
  if reply[1] == 1 and tonumber(ARGV[1]) > 0 then
    local value = string.format('%s:%d:%d:%d', id, reply[2], reply[3], reply[4])
    redis.call('SET', record, value, 'PXAT', expire_at(reply[2] + math.max(reply[3], 1000)))
  end
  return reply
end
