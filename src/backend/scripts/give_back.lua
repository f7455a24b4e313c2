-- Gives back what an admitted all-or-nothing call (multi.lua) took from fixed windows, when the
-- caller's decision as a whole was rejected elsewhere (another Cluster slot): KEYS[i] a fixed
-- window's key; ARGV = n, then per key two times (µs since the Unix epoch): the end of the window
-- that admitted the n, and the admission's `now`. The key that counted the admission, still in
-- that window, counts n fewer (never below 0), its TTL kept. Anything else is left alone: a key
-- whose window has ended (that window's count is gone), a key created after the admission (its
-- creation time `b`, see fixed_window.lua, is later: the admission's key was reset, expired or
-- evicted, and this one counts only what came since, in the same window), a key without `b`
-- (written by a version before it: it cannot say, so nothing is given back), and a key holding
-- anything else. A key listed twice gives back twice, as multi.lua took twice.
-- Reply: per key, 1 if it gave back, else 0.
local n = tonumber(ARGV[1])
local reply = {}
for i = 1, #KEYS do
  local given = 0
  local state = redis.pcall('HMGET', KEYS[i], 'w', 'l', 'c', 'b')
  if not state.err then
    local start, len, count = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
    local born = tonumber(state[4])
    local ends, at = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
    if start and len and count and born and start + len == ends and born <= at then
      redis.call('HSET', KEYS[i], 'c', math.max(count - n, 0))
      given = 1
    end
  end
  reply[i] = given
end
return reply
