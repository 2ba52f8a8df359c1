-- Take one permit of a semaphore, or renew the one `token` holds: one
-- script, so that no permit leaks between two steps (C19).
-- KEYS[1] permits, KEYS[2] holders, KEYS[3] fencing counter
-- ARGV[1] token, ARGV[2] limit (>= 1), ARGV[3] TTL in ms (>= 1),
-- ARGV[4] owner label ('' = none), ARGV[5] grant time in Unix ms,
-- ARGV[6] fence retention in ms (>= 1000), ARGV[7] change channel,
-- ARGV[8] PUBLISH or SPUBLISH, ARGV[9] the holder's metadata as compact
-- JSON ('' = none; a renewal keeps the last one given),
-- and the history tail (history.lua): KEYS[4] the history list, ARGV[10] to
-- ARGV[12] its length, how long it outlives a lease, and now in Unix ms
-- Returns
--   {1, fence, limit}    a new permit;
--   {2, fence, limit}    `token` held one: its lease is reset, same fence,
--                        no second permit (C18);
--   {0, retry_ms, limit} the semaphore is full: the earliest permit runs
--                        out in retry_ms;
--   {3, '', limit}       permits are held under another limit (`limit`).
-- The fence is a string (it may pass 2^31).
-- Publishes the change (src/lock/change.rs): `acquired FENCE TTL GRANTED
-- OWNER[\nMETA]` for a new permit, `extended FENCE TTL AT` for a renewal (AT:
-- this request's grant time, ARGV[5]).
history_mode = 'permit'
local permits, holders = KEYS[1], KEYS[2]
local token, limit, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_us()
local held = prune(permits, holders, now, ARGV[7], ARGV[8])
local set = tonumber(redis.call('HGET', holders, 'limit'))
if set and set ~= limit then
  return {3, '', set}
end
local mine = redis.call('HGET', holders, holder_field(token))
if mine and redis.call('ZSCORE', permits, token) then
  local record = cjson.decode(mine)
  if ARGV[4] ~= '' then
    record.owner = ARGV[4]
  end
  if ARGV[9] ~= '' then
    record.meta = ARGV[9]
  end
  reset_lease(permits, holders, token, record, ttl, now)
  tell(ARGV[8], ARGV[7], 'extended ' .. tostring(record.fence or '') .. ' ' .. ARGV[3]
    .. ' ' .. ARGV[5])
  return {2, record.fence, limit}
end
if held >= limit then
  local first = redis.call('ZRANGE', permits, '0', '0', 'WITHSCORES')
  return {0, math.max(1, math.ceil((tonumber(first[2]) - now) / 1000)), limit}
end
local fence, err = next_fence(KEYS[3], ARGV[6])
if not fence then
  return redis.error_reply('fence counter ' .. KEYS[3] .. ': ' .. err)
end
fence = string.format('%.0f', fence)
local record = {fence = fence, owner = ARGV[4], granted_at_ms = tonumber(ARGV[5]), ttl_ms = ttl,
  meta = ARGV[9]}
redis.call('ZADD', permits, int(now + us(ttl)), token)
redis.call('HSET', holders, 'limit', limit, holder_field(token), cjson.encode(record))
expire_with_last(permits, holders, now)
tell(ARGV[8], ARGV[7], 'acquired ' .. fence .. ' ' .. ARGV[3] .. ' ' .. ARGV[5] .. ' ' .. ARGV[4]
  .. meta_line(ARGV[9]))
return {1, fence, limit}
