-- Acquire a lock: SET NX PX and the fencing counter's INCR in one script,
-- so a grant and its fence can never be separated.
-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] holder metadata hash
-- ARGV[1] token, ARGV[2] TTL in ms (>= 1), ARGV[3] owner label ('' = none),
-- ARGV[4] grant time in Unix ms
-- Returns {1, fence} for a new grant, {2, fence} when this token already
-- held the lock (its lease is reset to the TTL, the fence is unchanged, the
-- owner label replaced when one is given; -1 when no fence is recorded),
-- {0, pttl} when another token holds it.
-- Redis does not roll a script back, so when the counter or the hash cannot
-- be written (a foreign client left a key of another type there), the lock
-- is deleted again before the error is returned: no half-written grant.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' and fence.err then
    redis.call('DEL', KEYS[1])
    return redis.error_reply('fence counter ' .. KEYS[2] .. ': ' .. fence.err)
  end
  redis.pcall('DEL', KEYS[3])
  local meta = redis.pcall('HSET', KEYS[3], 'fence', fence, 'owner', ARGV[3], 'granted_at_ms', ARGV[4])
  if type(meta) == 'table' and meta.err then
    redis.call('DEL', KEYS[1])
    return redis.error_reply('holder metadata ' .. KEYS[3] .. ': ' .. meta.err)
  end
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return {1, fence}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[3] ~= '' then
    redis.pcall('HSET', KEYS[3], 'owner', ARGV[3])
  end
  redis.pcall('PEXPIRE', KEYS[3], ARGV[2])
  local fence = redis.pcall('HGET', KEYS[3], 'fence')
  if type(fence) == 'string' then
    return {2, tonumber(fence)}
  end
  return {2, -1}
end
return {0, redis.call('PTTL', KEYS[1])}
