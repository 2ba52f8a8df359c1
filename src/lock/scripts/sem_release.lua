-- Give back the permit `token` holds. Publishes the release so that
-- waiters wake at once.
-- KEYS[1] permits, KEYS[2] holders
-- ARGV[1] token, ARGV[2] release channel, ARGV[3] PUBLISH or SPUBLISH
-- Returns 1 when released, 0 when `token` holds no permit (released or
-- run out: nothing is changed then).
local permits, holders = KEYS[1], KEYS[2]
local now = now_ms()
prune(permits, holders, now)
if redis.call('ZREM', permits, ARGV[1]) == 0 then
  return 0
end
redis.call('HDEL', holders, holder_field(ARGV[1]))
if redis.call('ZCARD', permits) == 0 then
  redis.call('DEL', holders)
end
redis.pcall(ARGV[3], ARGV[2], '')
return 1
