-- Read the holder of a lock in one atomic step: for GET /locks/{name}, and
-- for Redlock, which compares holders across nodes (the token never leaves
-- lockd). Put after semaphore.lua and shared.lua. Writes nothing (a shared
-- lease that ran out is left for the next write to forget).
-- KEYS[1] lock key, KEYS[2] holder metadata hash, KEYS[3] fencing counter
-- (read by the probe that wraps this script), KEYS[4] shared leases,
-- KEYS[5] their records, KEYS[6] waiting writers (see shared.lua)
-- Returns {pttl, token, fence, owner, granted_at_ms, writer_waits,
-- shared, meta}: pttl is -2 when the lock is free, -1 when a foreign client set
-- it without a TTL, -3 when it is held in shared mode (then `shared` is
-- {ttl_left_ms, record, ...} of the live shared leases, and the fields
-- before it are ''); writer_waits is 1 while an exclusive request waits;
-- missing fields are ''.
local writer = 0
if writer_waits_ms(KEYS[6]) then
  writer = 1
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
  if redis.call('EXISTS', KEYS[4]) == 0 then
    return {-2, '', '', '', '', writer, {}, ''}
  end
  local now = now_us()
  local live = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. int(now), '+inf', 'WITHSCORES')
  local leases = {}
  for i = 1, #live, 2 do
    local record = redis.call('HGET', KEYS[5], holder_field(live[i]))
    if record then
      leases[#leases + 1] = math.floor((tonumber(live[i + 1]) - now) / 1000)
      leases[#leases + 1] = record
    end
  end
  if #leases == 0 then
    return {-2, '', '', '', '', writer, {}, ''}
  end
  return {-3, '', '', '', '', writer, leases, ''}
end
local token = redis.call('GET', KEYS[1])
-- A renewal's owner and metadata (owner_now, meta_now) before the grant's.
local meta = redis.pcall('HMGET', KEYS[2], 'fence', 'owner', 'granted_at_ms', 'meta',
  'owner_now', 'meta_now')
if type(meta) ~= 'table' or meta.err then
  meta = {}
end
return {pttl, token, meta[1] or '', meta[5] or meta[2] or '', meta[3] or '', writer, {},
  meta[6] or meta[4] or ''}
