-- turnstile: the wrapper of an `acquire` call's scripts, after the prelude (and the algorithm or
-- chain files); the decisions of `try_acquire` run without it.
--
-- One attempt of an `acquire` call, which tries again after a rejection (RedisLimiter::acquire_n):
-- KEYS[#KEYS] is the subject's record, `prefix:{subject}:acq` (the subject's hash tag, so its
-- slot), a hash of call id -> "now:reset_after:remaining:held:params" of the acquire calls Redis
-- admitted on the subject (held: until when, in µs, the admission counts in every limit: a chain
-- replies its longest reset_after, and a permit of a shorter limit stops counting at that limit's
-- reset; an exact sliding window replies when its whole log is empty again, and its own permits
-- stop counting a window after the admission, sooner where older permits expire later; params: the parameters it was decided under, ARGV after n joined by commas, as a
-- reconfiguration between two attempts can end the window it counts in sooner, at a time the
-- field cannot know; a field written before both were stored, "now:reset_after:remaining", is
-- held until its now + reset_after under any parameters); ARGV[#ARGV] is the most calls it holds
-- (REDIS_ACQUIRE_RECORDS) and ARGV[#ARGV - 1] the id every attempt of this call carries. All three are taken off before `decide` (a runner:
-- `single`, or the chain's) reads the others. An attempt that timed out may have run late and
-- admitted while its caller was told to wait (by a fallback that rejected): the call's next
-- attempt then finds its id in the record and answers the recorded admission instead of taking
-- the permits again, if the admission still counts (its `held` has not passed, and the
-- parameters are the same; otherwise the attempt decides afresh). An admission adds its call's field; a full record first drops its oldest
-- admissions (the smallest `now`), so that a call's field survives the admission of at least
-- `cap - 1` others, and the subject's memory stays bounded whatever its traffic. The record
-- expires at the latest of its admissions' resets (their permits stop counting then, so a second
-- charge could no longer matter): an admission never shortens its TTL.
local function once(decide)
  local record = table.remove(KEYS)
  local cap = tonumber(table.remove(ARGV))
  local id = table.remove(ARGV)
  local params = table.concat(ARGV, ',', 2)
  -- Anything but a hash (an older version's string record) answers an error: read as no record.
  local held = redis.pcall('HGET', record, id)
  if type(held) == 'string' then
    local f = {}
    for field in string.gmatch(held, '[^:]+') do f[#f + 1] = field end
    local at, reset = whole(f[1], MAX_TIME), whole(f[2], MAX_TIME)
    local remaining = whole(f[3], MAX_COUNT)
    local held_until = nil
    if at and reset then held_until = whole(f[4] or (at + reset), MAX_TIME) end
    -- Only while the admission still counts, in every limit: the record outlives a field
    -- whose reset has passed when later admissions extended it, and answering that field
    -- admitted the call now on a permit that weighs on nothing any more (a chain's field past
    -- its shortest reset, on nothing in that limit; a field of other parameters, past a
    -- shorter window that ended its own early), whose window others may have filled.
    if (#f == 3 or (#f == 5 and f[5] == params)) and held_until and remaining
        and held_until > now_us() then
      return {1, at, reset, remaining}
    end
  end
  local reply = decide()
  if reply[1] == 1 and tonumber(ARGV[1]) > 0 then
    local len = redis.pcall('HLEN', record)
    if type(len) ~= 'number' then
      redis.call('DEL', record)
    elseif len >= cap then
      -- The oldest admissions out (a field that is no admission first), down to cap - 1.
      local all = redis.call('HGETALL', record)
      local fields = {}
      for i = 1, #all, 2 do
        local at = whole(string.match(all[i + 1], '^[^:]*'), MAX_TIME) or -1
        fields[#fields + 1] = {at, all[i]}
      end
      table.sort(fields, function(a, b) return a[1] < b[1] end)
      for i = 1, len - cap + 1 do
        redis.call('HDEL', record, fields[i][2])
      end
    end
    local value = string.format('%d:%d:%d:%d:%s', reply[2], reply[3], reply[4],
      reply[2] + (counted_for or reply[3]), params)
    redis.call('HSET', record, id, value)
    -- Extended, never shortened. The record's expiry is PTTL after the clock PTTL read (Redis
    -- 7.0 reads the real clock, Valkey 8 the script's start); TIME read after it is no earlier
    -- on either, so that TIME rounded up plus PTTL is never before the expiry in force.
    local expiry = expire_at(reply[2] + math.max(reply[3], 1000))
    local ttl = redis.call('PTTL', record)
    if ttl < 0 or expiry > math.ceil(now_us() / 1000) + ttl then
      redis.call('PEXPIREAT', record, expiry)
    end
  end
  return reply
end
