-- Release a lock: compare the token, then delete. Never a plain DEL.
-- Publishes `released FENCE` on the change channel (src/lock/change.rs),
-- so that waiters wake at once and watchers hear it.
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
local meta = redis.pcall('HMGET', KEYS[2], 'granted_at_ms', 'fence')
if type(meta) ~= 'table' or meta.err then
  meta = {}
end
local granted = meta[1] or ''
redis.call('DEL', KEYS[1], KEYS[2])
-- pcall: a server without SPUBLISH (Redis 6) still releases. A lock that a
-- foreign client set has no fence: an empty message says only "changed".
local message = ''
if meta[2] then
  message = 'released ' .. meta[2]
end
redis.pcall(ARGV[3], ARGV[2], message)
return {1, granted}
