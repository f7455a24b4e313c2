-- Several limiters, each with its own subject, all or nothing, in one script (see members.lua;
-- the keys may lie in any slot, so on a standalone server, or on a Cluster when the caller makes
-- them share one, as the HTTP layer's rules do there). Reply {all admitted (1 or 0),
-- now, then per member: admitted (1 or 0), t, remaining, then the count of unreadable keys if
-- there were any}: an admitted member's t is its
-- reset_after and remaining what is left; a rejected member's t is its retry_after (remaining 0).
-- When the call as a whole is rejected nothing was taken (but see the last ARGV below), so the
-- members that would have admitted report their state as it stands: a probe (n = 0), which
-- writes nothing.
-- The last ARGV, after every member's three (absent for the HTTP layer's rules): 1 asks that a
-- member over its limit count its n all the same, past the limit, as Envoy's rate limit service
-- counts a descriptor's hits whether or not they fit; 2 asks the same of a call whose decision
-- the caller has rejected already, which then takes nothing from the members that admit.
local over = ARGV[3 * #KEYS + 2]
local now, n, all, results = all_or_nothing(over == '2')
local reply = {all and 1 or 0, now}
for i = 1, #KEYS do
  local admitted, t, left = results[i][1], results[i][2], results[i][3]
  if admitted and not all and n > 0 then
    local _
    _, t, left = decide(i, 0, now)
  end
  if not admitted then left = 0 end
  reply[#reply + 1] = admitted and 1 or 0
  reply[#reply + 1] = t
  reply[#reply + 1] = left
end
-- Counted over the limit when asked (see `over` above); the members that would have admitted
-- still take nothing.
if not all and n > 0 and (over == '1' or over == '2') then
  for i = 1, #KEYS do
    if not results[i][1] then
      local _, _, _, _, _, charge = decide(i, 0, now)
      charge(n)
    end
  end
end
return reported(reply)
