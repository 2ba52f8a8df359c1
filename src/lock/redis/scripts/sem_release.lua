-- Give back the permit `token` holds. Publishes `released FENCE` on the
-- change channel (src/lock/change.rs), so that waiters wake at once and
-- watchers hear it.
-- KEYS[1] permits, KEYS[2] holders
-- ARGV[1] token, ARGV[2] release channel, ARGV[3] PUBLISH or SPUBLISH,
-- and the history tail (history.lua): KEYS[3] the history list, ARGV[4] to
-- ARGV[6] its length, how long it outlives a lease, and now in Unix ms
-- Returns {1, granted_at_ms} when released (granted_at_ms 0 when not
-- recorded), {0, 0} when `token` holds no permit (given back or run out:
-- nothing is changed then).
history_mode = 'permit'
local permits, holders = KEYS[1], KEYS[2]
local now = now_us()
prune(permits, holders, now, ARGV[2], ARGV[3])
local field = holder_field(ARGV[1])
local mine = redis.call('HGET', holders, field)
if redis.call('ZREM', permits, ARGV[1]) == 0 then
  return {0, 0}
end
redis.call('HDEL', holders, field)
if redis.call('ZCARD', permits) == 0 then
  redis.call('DEL', holders)
end
local granted_at, message = 0, ''
if mine then
  local record = cjson.decode(mine)
  granted_at = tonumber(record.granted_at_ms) or 0
  if record.fence then
    message = 'released ' .. record.fence
  end
end
tell(ARGV[3], ARGV[2], message)
return {1, granted_at}
