-- Extend a lock: compare the token, then PEXPIRE. Never creates a key.
-- Publishes on the release channel too, so that waiters learn the new lease
-- end (an extend may shorten the lease).
-- KEYS[1] lock key, KEYS[2] holder metadata hash
-- ARGV[1] token, ARGV[2] new TTL in ms (>= 1; PEXPIRE with 0 would delete),
-- ARGV[3] release channel (KEYS[1] .. ':released')
-- Returns {1, fence} when extended (fence -1 when none is recorded),
-- {0, 0} when nobody holds the lock, {-1, 0} when another token holds it.
local current = redis.call('GET', KEYS[1])
if not current then
  return {0, 0}
end
if current ~= ARGV[1] then
  return {-1, 0}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.pcall('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PUBLISH', ARGV[3], '')
local fence = redis.pcall('HGET', KEYS[2], 'fence')
if type(fence) == 'string' then
  return {1, tonumber(fence)}
end
return {1, -1}
