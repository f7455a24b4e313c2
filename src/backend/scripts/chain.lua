-- Several limits for one subject, all or nothing, in one script (see members.lua; here every key
-- is in the subject's hash tag). Reply {1, now, largest reset_after, smallest remaining} or
-- {0, now, largest retry_after, the 1-based index of the member that gave it}; the count of
-- unreadable keys after them if there were any (see `discard` in the prelude).
local now, _, all, results = all_or_nothing()
local reset, remaining = 0, nil
local worst, worst_at = -1, 0
for i = 1, #KEYS do
  local admitted, t, left = results[i][1], results[i][2], results[i][3]
  if not admitted then
    if t > worst then
      worst, worst_at = t, i
    end
  else
    if t > reset then reset = t end
    local held = results[i][4]
    if counted_for == nil or held < counted_for then counted_for = held end
    if remaining == nil or left < remaining then remaining = left end
  end
end
if not all then
  return reported({0, now, worst, worst_at})
end
return reported({1, now, reset, remaining})
