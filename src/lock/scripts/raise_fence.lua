-- Redlock: after a grant on a quorum whose fencing counters differ (a node
-- lost its data), raise this node's counter to the fence the grant reports,
-- so that the next grant on any quorum gets a larger one.
-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] holder metadata hash
-- ARGV[1] token, ARGV[2] fence
-- Returns 1 when done, 0 when the token no longer holds the lock here.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
redis.call('HSET', KEYS[3], 'fence', ARGV[2])
return 1
