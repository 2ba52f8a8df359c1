-- Read a semaphore: its limit and its live permits, never a token. Writes
-- nothing (a permit that ran out is left for the next write to forget).
-- KEYS[1] permits, KEYS[2] holders
-- Returns {limit, ttl_left_ms, record, ttl_left_ms, record, ...}, earliest
-- expiry first, or {0} when no permit is held.
local permits, holders = KEYS[1], KEYS[2]
local now = now_us()
local live = redis.call('ZRANGEBYSCORE', permits, '(' .. int(now), '+inf', 'WITHSCORES')
if #live == 0 then
  return {0}
end
local out = {tonumber(redis.call('HGET', holders, 'limit')) or 0}
for i = 1, #live, 2 do
  local record = redis.call('HGET', holders, holder_field(live[i]))
  if record then
    out[#out + 1] = math.floor((tonumber(live[i + 1]) - now) / 1000)
    out[#out + 1] = record
  end
end
return out
