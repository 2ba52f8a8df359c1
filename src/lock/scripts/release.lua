-- Release a lock: compare the token, then delete. Never a plain DEL.
-- Publishes the release so that waiters wake at once.
-- KEYS[1] lock key, KEYS[2] holder metadata hash
-- ARGV[1] token, ARGV[2] release channel (KEYS[1] .. ':released')
-- Returns {1, grant time in Unix ms ('' when not recorded)} when released,
-- {0, ''} when nobody holds the lock, {-1, ''} when another token holds it
-- (nothing is changed then).
local current = redis.call('GET', KEYS[1])
if not current then
  return {0, ''}
end
if current ~= ARGV[1] then
  return {-1, ''}
end
local granted = redis.pcall('HGET', KEYS[2], 'granted_at_ms')
if type(granted) ~= 'string' then
  granted = ''
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('PUBLISH', ARGV[2], '')
return {1, granted}
