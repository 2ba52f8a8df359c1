-- Extend a lock: compare the token, then PEXPIRE. Never creates a lock.
-- Publishes `extended FENCE TTL AT` on the change channel too
-- (src/lock/change.rs), so that waiters learn the new lease end (an extend
-- may shorten the lease) and watchers hear it.
-- Put after fence.lua and history.lua; the shared-lease rules (tell.lua,
-- semaphore.lua, shared.lua) take the place of the `-- @shared-rules` line
-- (as in acquire.lua): a token that holds a shared lease extends that
-- lease alone (never another's).
-- KEYS[1] lock key, KEYS[2] holder metadata hash, KEYS[3] fencing counter,
-- KEYS[4] shared leases, KEYS[5] their records (see shared.lua)
-- ARGV[1] token, ARGV[2] new TTL in ms ('' = the lock's own TTL, recorded
-- in the hash at its grant or last extend), ARGV[3] release channel
-- (KEYS[1] .. ':released'), ARGV[4] the TTL in ms when ARGV[2] is '' and
-- the hash records none (a lock granted by an older lockd), ARGV[5] fence
-- retention in ms, ARGV[6] the command to publish with: PUBLISH, or SPUBLISH
-- on a Redis Cluster, ARGV[7] when the extend was sent, in Unix ms,
-- and the history tail (history.lua): KEYS[6] the history list, ARGV[8] to
-- ARGV[10] its length, how long it outlives a lease, and now in Unix ms
-- Returns {1, fence, ttl_ms} when extended, {0, 0, 0} when nobody holds the
-- lock, {-1, 0, 0} when another token holds it. A lock that a foreign
-- client set without a fence gets one (next_fence, from fence.lua in front
-- of this script), so every lease has a fence.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  local meta = redis.pcall('HMGET', KEYS[2], 'fence', 'ttl_ms')
  if type(meta) ~= 'table' or meta.err then
    return redis.error_reply('holder metadata ' .. KEYS[2] .. ': ' .. (meta.err or 'unreadable'))
  end
  local ttl = ARGV[2]
  if ttl == '' then
    ttl = meta[2]
    if not tonumber(ttl or '') then
      ttl = ARGV[4]
    end
  end
  local fence = meta[1]
  if not (fence and string.find(fence, '^%d+$')) then
    local err
    fence, err = next_fence(KEYS[3], ARGV[5])
    if not fence then
      return redis.error_reply('fence counter ' .. KEYS[3] .. ': ' .. err)
    end
    redis.call('HSET', KEYS[2], 'fence', fence)
  end
  redis.call('HSET', KEYS[2], 'ttl_ms', ttl,
    'ends_ms', string.format('%d', tonumber(ARGV[7]) + tonumber(ttl)))
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], holder_keep_ms(ttl))
  publish_change(ARGV[6], ARGV[3], 'extended ' .. fence .. ' ' .. ttl .. ' ' .. ARGV[7])
  return {1, fence, ttl}
end
if current then
  return {-1, 0, 0}
end
-- @shared-rules
if live_shared(KEYS[4], KEYS[5], ARGV[3], ARGV[6]) == 0 then
  return {0, 0, 0}
end
local field = holder_field(ARGV[1])
local mine = redis.call('HGET', KEYS[5], field)
-- Not held under this token (as a permit), though others hold the lock.
if not (mine and redis.call('ZSCORE', KEYS[4], ARGV[1])) then
  return {0, 0, 0}
end
local record = cjson.decode(mine)
local ttl = tonumber(ARGV[2]) or tonumber(record.ttl_ms) or tonumber(ARGV[4])
reset_lease(KEYS[4], KEYS[5], ARGV[1], record, ttl, now_us())
tell(ARGV[6], ARGV[3], 'extended ' .. tostring(record.fence) .. ' '
  .. string.format('%.0f', ttl) .. ' ' .. ARGV[7])
return {1, tonumber(record.fence), ttl}
