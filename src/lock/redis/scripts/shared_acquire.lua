-- Take a shared lease on a lock, or renew the one `token` holds: one
-- script, so that a shared lease is never granted beside an exclusive
-- holder. Put after fence.lua, semaphore.lua and shared.lua.
-- KEYS and ARGV as for acquire.lua, history tail included (ARGV[8] is not
-- used: a shared request that waits keeps no one out).
-- Returns {1, fence} for a new shared lease, {2, fence} when `token` held
-- one (its lease is reset, the fence unchanged, never a second lease),
-- {0, retry_ms} when an exclusive holder is live (until its lease ends; -1
-- when its key has no TTL, set by a client other than lockd) or
-- an exclusive request waits (until it stops waiting at the latest),
-- {3, 0} when `token` holds the lock exclusively (nothing is changed).
-- Publishes `shared FENCE TTL GRANTED OWNER[\nMETA]` for a new lease, `extended
-- FENCE TTL AT` for a renewal (src/lock/change.rs).
local shared, readers, writers = KEYS[4], KEYS[5], KEYS[6]
local token, ttl = ARGV[1], tonumber(ARGV[2])
local holder = redis.call('GET', KEYS[1])
if holder then
  if holder == token then
    return {3, 0}
  end
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then
    -- A key a foreign client set without a TTL: no end to tell.
    return {0, -1}
  end
  return {0, math.max(1, pttl)}
end
local now = now_us()
local held = prune(shared, readers, now, ARGV[6], ARGV[7])
local field = holder_field(token)
local mine = redis.call('HGET', readers, field)
if mine and redis.call('ZSCORE', shared, token) then
  local record = cjson.decode(mine)
  if ARGV[3] ~= '' then
    record.owner = ARGV[3]
  end
  if ARGV[10] ~= '' then
    record.meta = ARGV[10]
  end
  reset_lease(shared, readers, token, record, ttl, now)
  tell(ARGV[7], ARGV[6], 'extended ' .. tostring(record.fence) .. ' ' .. ARGV[2]
    .. ' ' .. ARGV[4])
  return {2, tonumber(record.fence)}
end
if ARGV[9] == '1' then
  return {0, -2}
end
local waits = writer_waits_ms(writers, now)
if waits then
  return {0, waits}
end
local fence, err = next_fence(KEYS[2], ARGV[5])
if not fence then
  return redis.error_reply('fence counter ' .. KEYS[2] .. ': ' .. err)
end
local text = fence
local record = {fence = text, owner = ARGV[3], granted_at_ms = tonumber(ARGV[4]), ttl_ms = ttl,
  meta = ARGV[10]}
redis.call('ZADD', shared, int(now + us(ttl)), token)
redis.call('HSET', readers, field, cjson.encode(record))
expire_with_last(shared, readers, now)
publish_change(ARGV[7], ARGV[6], 'shared ' .. text .. ' ' .. ARGV[2] .. ' ' .. ARGV[4] .. ' '
  .. ARGV[3] .. meta_line(ARGV[10]))
history_granted(text, 'shared', ARGV[4], ARGV[2], ARGV[3], ARGV[10], held == 0)
return {1, fence}
