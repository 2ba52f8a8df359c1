-- Break permits of a semaphore: end one permit (by fence) or every live
-- one, whatever the token, for an admin (DELETE
-- /semaphores/{name}?force=true).
-- KEYS[1] permits, KEYS[2] holders, KEYS[3] the history list
-- ARGV[1] the fence of the permit to end ('' = every live one), ARGV[2]
-- the id of the key that breaks it, ARGV[3] change channel, ARGV[4]
-- PUBLISH or SPUBLISH, and the history tail (history.lua): ARGV[5] to
-- ARGV[7]
-- Publishes `broken FENCE BY` for each permit ended.
-- Returns {fence, 'permit', owner, meta, ...} of each permit ended.
history_mode = 'permit'
local permits, holders = KEYS[1], KEYS[2]
local now = now_us()
local out = {}
if prune(permits, holders, now, ARGV[3], ARGV[4]) == 0 then
  return out
end
break_leases(permits, holders, ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'permit', out)
if redis.call('ZCARD', permits) == 0 then
  redis.call('DEL', holders)
else
  expire_with_last(permits, holders, now)
end
return out
