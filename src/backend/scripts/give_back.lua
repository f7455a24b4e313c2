-- Gives back what an admitted all-or-nothing call (multi.lua) took from fixed windows, when the
-- caller's decision as a whole was rejected elsewhere (another Cluster slot): KEYS[i] a fixed
-- window's key; ARGV = n, then per key the end (µs since the Unix epoch) of the window that
-- admitted the n. A key still in that window counts n fewer (never below 0), its TTL kept; a key
-- whose window has ended, or that holds anything else, is left alone (that window's count is
-- gone or was never this call's). A key listed twice gives back twice, as multi.lua took twice.
-- Reply: per key, 1 if it gave back, else 0.
local n = tonumber(ARGV[1])
local reply = {}
for i = 1, #KEYS do
  local given = 0
  local state = redis.pcall('HMGET', KEYS[i], 'w', 'l', 'c')
  if not state.err then
    local start, len, count = tonumber(state[1]), tonumber(state[2]), tonumber(state[3])
    if start and len and count and start + len == tonumber(ARGV[i + 1]) then
      redis.call('HSET', KEYS[i], 'c', math.max(count - n, 0))
      given = 1
    end
  end
  reply[i] = given
end
return reply
