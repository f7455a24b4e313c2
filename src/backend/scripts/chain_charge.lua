-- A charge to every limit of one subject, in one script (see members.lua; every key is in the
-- subject's hash tag). Reply {1, now, largest reset_after, smallest remaining}: as chain.lua's
-- admission, what is left is the tightest member's, and full again is the slowest member's.
local now, results = charge_all()
local reset, remaining = 0, nil
for i = 1, #KEYS do
  local t, left = results[i][1], results[i][2]
  if t > reset then reset = t end
  if remaining == nil or left < remaining then remaining = left end
end
return reported({1, now, reset, remaining})
