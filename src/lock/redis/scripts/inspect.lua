-- Read the holder of a lock in one atomic step: for GET /locks/{name}, and
-- for Redlock, which compares holders across nodes (the token never leaves
-- lockd).
-- KEYS[1] lock key, KEYS[2] holder metadata hash
-- Returns {pttl, token, fence, owner, granted_at_ms}: pttl is -2 when the
-- lock is free (-1 when a foreign client set it without a TTL); missing
-- fields are ''.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
  return {-2, '', '', '', ''}
end
local token = redis.call('GET', KEYS[1])
local meta = redis.pcall('HMGET', KEYS[2], 'fence', 'owner', 'granted_at_ms')
if type(meta) ~= 'table' or meta.err then
  meta = {}
end
return {pttl, token, meta[1] or '', meta[2] or '', meta[3] or ''}
