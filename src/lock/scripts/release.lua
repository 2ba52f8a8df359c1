-- Release a lock: compare the token, then delete. Never a plain DEL.
-- Publishes the release so that waiters wake at once.
-- KEYS[1] lock key, KEYS[2] holder metadata hash
-- ARGV[1] token, ARGV[2] release channel (KEYS[1] .. ':released'),
-- ARGV[3] the command to publish it with: PUBLISH, or SPUBLISH on a Redis
-- Cluster (sharded pub/sub: the channel shares the keys' slot)
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
-- pcall: a server without SPUBLISH (Redis 6) still releases.
redis.pcall(ARGV[3], ARGV[2], '')
return {1, granted}
