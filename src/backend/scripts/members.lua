-- Several members, all or nothing: KEYS[i] is member i's key; ARGV = n, then per member:
-- algorithm (1 fixed window, 2 sliding window, 3 sliding counter, 4 token bucket), p1, p2.
-- Needs the prelude and the four algorithm files before it.
local algorithms = {fixed_window, sliding_window, sliding_counter, token_bucket}

-- Member i's decision for `n` permits at `now`, writing nothing: as an algorithm function.
local function decide(i, n, now)
  local algorithm = algorithms[tonumber(ARGV[3 * i - 1])]
  return algorithm(KEYS[i], n, tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), now)
end

-- Keys listed more than once (only multi.lua's callers can: two limiters, or two rules, sharing
-- one key): the set of them, or nil if every key is listed once.
local function repeated_keys()
  local seen, repeated = {}, nil
  for i = 1, #KEYS do
    if seen[KEYS[i]] then
      repeated = repeated or {}
      repeated[KEYS[i]] = true
    end
    seen[KEYS[i]] = true
  end
  return repeated
end

-- A repeated key's state as it was before the call wrote to it: its DUMP and its expiry (ms
-- since the Unix epoch, -1 for none), or false if it did not exist.
local function snapshot(key)
  local dump = redis.call('DUMP', key)
  if not dump then return false end
  local at = redis.pcall('PEXPIRETIME', key)
  if type(at) ~= 'number' then
    -- Redis 6.2 has no PEXPIRETIME: the TTL from this script's clock (a millisecond later at
    -- most, never earlier).
    local ttl = redis.call('PTTL', key)
    if ttl < 0 then at = -1 else at = math.ceil(now_us() / 1000) + ttl end
  end
  return {dump, at}
end

-- Puts back what `snapshot` saw: RESTORE of a DUMP gives the same value, with the same absolute
-- expiry (a relative TTL read and given again moved it by the millisecond that passed between).
local function restore(key, saved)
  redis.call('DEL', key)
  if saved then
    if saved[2] < 0 then
      redis.call('RESTORE', key, 0, saved[1])
    else
      redis.call('RESTORE', key, saved[2], saved[1], 'ABSTTL')
    end
  end
end

-- Every member decides on the state before any write; only if all admit (and n > 0) are they
-- all committed, so a rejection charges no member; otherwise every key is repaired.
-- A key listed more than once is decided in order instead, each occurrence on the state the one
-- before it left: an occurrence that admits is committed at once (after a snapshot of the key's
-- first state), and if the call as a whole rejects, the key is restored from the snapshot and
-- repaired as its first occurrence read it. Deciding every occurrence on the first state, the
-- second write overwrote the first and the call counted n where it took 2n.
-- `refused`: the caller's decision is rejected already, so nothing is committed whatever the
-- members say (they are decided, and repaired, as for a rejected call).
-- Returns now, n, whether all admitted, and per member {admitted, t, remaining, held} (held: how
-- long an admission's permits count, its `held` or else its reset_after).
local function all_or_nothing(refused)
  local now = now_us()
  local n = tonumber(ARGV[1])
  local repeated = nil
  if n > 0 then repeated = repeated_keys() end
  local results, commits, repairs = {}, {}, {}
  local saved, first_repair = {}, {}
  local all = true
  for i = 1, #KEYS do
    local key = KEYS[i]
    local admitted, t, left, commit, repair, _, held = decide(i, n, now)
    results[i] = {admitted, t, left, held or t}
    commits[i], repairs[i] = commit, repair
    if refused or not admitted then all = false end
    if repeated and repeated[key] then
      if saved[key] == nil then
        saved[key], first_repair[key] = snapshot(key), repair
      end
      if admitted then commit() end
    end
  end
  for i = 1, #KEYS do
    local key = KEYS[i]
    if repeated and repeated[key] then
      if not all and saved[key] ~= nil then
        restore(key, saved[key])
        first_repair[key]()
        saved[key] = nil
      end
    elseif all and n > 0 then
      commits[i]()
    else
      repairs[i]()
    end
  end
  return now, n, all, results
end

-- Every member charged `n` (ARGV[1]) at one `now`, unchecked (see `charge_one` in the prelude):
-- each reads its state with a probe that writes nothing, then records its charge. Returns now
-- and per member {reset_after, remaining} after the charge.
local function charge_all()
  local now = now_us()
  local n = tonumber(ARGV[1])
  local results = {}
  for i = 1, #KEYS do
    local _, _, _, _, _, charge = decide(i, 0, now)
    local reset, left = charge(n)
    results[i] = {reset, left}
  end
  return now, results
end
