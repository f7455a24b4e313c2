-- Several members, all or nothing: KEYS[i] is member i's key; ARGV = n, then per member:
-- algorithm (1 fixed window, 2 sliding window, 3 sliding counter, 4 token bucket), p1, p2.
-- Needs the prelude and the four algorithm files before it.
local algorithms = {fixed_window, sliding_window, sliding_counter, token_bucket}

-- Member i's decision for `n` permits at `now`, writing nothing: as an algorithm function.
local function decide(i, n, now)
  local algorithm = algorithms[tonumber(ARGV[3 * i - 1])]
  return algorithm(KEYS[i], n, tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), now)
end

-- Every member decides on the state before any write; only if all admit (and n > 0) are they
-- all committed, so a rejection charges no member; otherwise every key is repaired.
-- Returns now, n, whether all admitted, and per member {admitted, t, remaining}.
local function all_or_nothing()
  local now = now_us()
  local n = tonumber(ARGV[1])
  local results, commits, repairs = {}, {}, {}
  local all = true
  for i = 1, #KEYS do
    local admitted, t, left, commit, repair = decide(i, n, now)
    results[i] = {admitted, t, left}
    commits[i], repairs[i] = commit, repair
    if not admitted then all = false end
  end
  for i = 1, #KEYS do
    if all and n > 0 then
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
