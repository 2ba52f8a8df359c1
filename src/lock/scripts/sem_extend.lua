-- Extend the permit `token` holds to a new TTL; never recreates one.
-- KEYS[1] permits, KEYS[2] holders
-- ARGV[1] token, ARGV[2] TTL in ms (>= 1)
-- Returns {1, fence, limit} when extended, {0, '', 0} when `token` holds
-- no permit (released or run out).
local permits, holders = KEYS[1], KEYS[2]
local token, ttl = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
prune(permits, holders, now)
local mine = redis.call('HGET', holders, holder_field(token))
if not (mine and redis.call('ZSCORE', permits, token)) then
  return {0, '', 0}
end
local record = cjson.decode(mine)
record.ttl_ms = ttl
redis.call('ZADD', permits, 'XX', now + ttl, token)
redis.call('HSET', holders, holder_field(token), cjson.encode(record))
expire_with_last(permits, holders, now)
return {1, record.fence, tonumber(redis.call('HGET', holders, 'limit'))}
