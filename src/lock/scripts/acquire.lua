-- Acquire a lock: SET NX PX and the fencing counter's INCR in one script,
-- so a grant and its fence can never be separated.
-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] holder metadata hash
-- ARGV[1] token, ARGV[2] TTL in ms (>= 1), ARGV[3] owner label ('' = none),
-- ARGV[4] grant time in Unix ms
-- Returns {1, fence} for a new grant, {2, fence} when this token already
-- held the lock (its lease is reset to the TTL, the fence is unchanged; -1
-- when no fence is recorded), {0, pttl} when another token holds it.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.call('INCR', KEYS[2])
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], 'fence', fence, 'owner', ARGV[3], 'granted_at_ms', ARGV[4])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return {1, fence}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  local fence = redis.call('HGET', KEYS[3], 'fence')
  if fence then
    return {2, tonumber(fence)}
  end
  return {2, -1}
end
return {0, redis.call('PTTL', KEYS[1])}
