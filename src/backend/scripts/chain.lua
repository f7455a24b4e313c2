-- Several limits for one subject, all or nothing, in one script: KEYS[i] is member i's key (all
-- in the subject's hash tag); ARGV = n, then per member: algorithm (1 fixed window, 2 sliding
-- window, 3 sliding counter, 4 token bucket), p1, p2.
-- Every member decides on the state before any write; only if all admit are they all committed,
-- so a rejection charges no member. Reply {1, now, largest reset_after, smallest remaining} or
-- {0, now, largest retry_after, the 1-based index of the member that gave it}.
local algorithms = {fixed_window, sliding_window, sliding_counter, token_bucket}
local now = now_us()
local n = tonumber(ARGV[1])
local commits, repairs = {}, {}
local reset, remaining = 0, nil
local worst, worst_at = -1, 0
for i = 1, #KEYS do
  local algorithm = algorithms[tonumber(ARGV[3 * i - 1])]
  local admitted, t, left, commit, repair =
    algorithm(KEYS[i], n, tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), now)
  repairs[i] = repair
  if not admitted then
    if t > worst then
      worst, worst_at = t, i
    end
  else
    commits[i] = commit
    if t > reset then reset = t end
    if remaining == nil or left < remaining then remaining = left end
  end
end
if worst_at > 0 or n == 0 then
  for i = 1, #KEYS do
    repairs[i]()
  end
  if worst_at > 0 then
    return {0, now, worst, worst_at}
  end
else
  for i = 1, #KEYS do
    commits[i]()
  end
end
return {1, now, reset, remaining}
