-- Read what GET /locks/{name} shows, in one atomic step.
-- KEYS[1] lock key, KEYS[2] holder metadata hash
-- Returns {pttl, fence, owner, granted_at_ms}: pttl is -2 when the lock is
-- free (-1 when a foreign client set it without a TTL); missing metadata
-- fields are ''.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
  return {-2, '', '', ''}
end
local meta = redis.call('HMGET', KEYS[2], 'fence', 'owner', 'granted_at_ms')
return {pttl, meta[1] or '', meta[2] or '', meta[3] or ''}
