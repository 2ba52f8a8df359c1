-- Extend a lock: compare the token, then PEXPIRE. Never creates a key.
-- KEYS[1] lock key, KEYS[2] holder metadata hash
-- ARGV[1] token, ARGV[2] new TTL in ms (>= 1; PEXPIRE with 0 would delete)
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
redis.call('PEXPIRE', KEYS[2], ARGV[2])
local fence = redis.call('HGET', KEYS[2], 'fence')
if fence then
  return {1, tonumber(fence)}
end
return {1, -1}
