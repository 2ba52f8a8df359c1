-- Release a lock: compare the token, then delete. Never a plain DEL.
-- Put after history.lua; the shared-lease rules (tell.lua, semaphore.lua,
-- shared.lua) take the place of the `-- @shared-rules` line (as in
-- acquire.lua): a token that holds a shared lease releases that lease
-- alone.
-- Publishes `released FENCE` on the change channel (src/lock/change.rs),
-- so that waiters wake at once and watchers hear it.
-- KEYS[1] lock key, KEYS[2] holder metadata hash, KEYS[3] shared leases,
-- KEYS[4] their records, KEYS[5] waiting writers (see shared.lua)
-- ARGV[1] token, ARGV[2] release channel (KEYS[1] .. ':released'),
-- ARGV[3] the command to publish it with: PUBLISH, or SPUBLISH on a Redis
-- Cluster (sharded pub/sub: the channel shares the keys' slot),
-- and the history tail (history.lua): KEYS[6] the history list, ARGV[4] to
-- ARGV[6] its length, how long it outlives a lease, and now in Unix ms
-- Returns {1, grant time in Unix ms ('' when not recorded)} when released
-- (an exclusive holder), {2, grant time} when a shared lease was released,
-- {0, ''} when nobody holds the lock, {-1, ''} when another token holds it
-- (nothing is changed then). Unless `token` holds the lock, a wait of
-- `token` for it is forgotten (a caller that hung up, say): shared
-- requests that it kept out are woken with an empty message ("changed").
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  -- The exclusive holder: a grant forgot its wait, so there is none to
  -- withdraw.
  -- The fields of its history entry too, while the history is on: the
  -- entry is written now, whole (history_closed).
  local meta
  if history_on then
    meta = redis.pcall('HMGET', KEYS[2], 'granted_at_ms', 'fence', 'ends_ms', 'owner', 'meta')
  else
    meta = redis.pcall('HMGET', KEYS[2], 'granted_at_ms', 'fence')
  end
  if type(meta) ~= 'table' or meta.err then
    meta = {}
  end
  redis.call('DEL', KEYS[1], KEYS[2])
  -- A lock that a foreign client set has no fence: an empty message says
  -- only "changed".
  if meta[2] then
    publish_change(ARGV[3], ARGV[2], 'released ' .. meta[2])
    history_closed(meta[2], 'exclusive', meta[1], meta[3], meta[4], meta[5], 'released', history_now)
  else
    publish_change(ARGV[3], ARGV[2], '')
  end
  return {1, meta[1] or ''}
end
-- @shared-rules
local withdrawn = redis.call('ZREM', KEYS[5], ARGV[1])
local function refused(verdict)
  if withdrawn == 1 then
    redis.pcall(ARGV[3], ARGV[2], '')
  end
  return {verdict, ''}
end
if current then
  return refused(-1)
end
if live_shared(KEYS[3], KEYS[4], ARGV[2], ARGV[3]) == 0 then
  return refused(0)
end
local field = holder_field(ARGV[1])
local mine = redis.call('HGET', KEYS[4], field)
-- A token with no shared lease: not held (as a permit), though other
-- shared leases hold the lock, so that a release retried after a
-- lagging one hears that it is gone.
if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then
  return refused(0)
end
redis.call('HDEL', KEYS[4], field)
local alone = redis.call('ZCARD', KEYS[3]) == 0
if alone then
  -- The last shared lease: the lock is free, and the waiting writers
  -- are forgotten with it. One still there takes the lock at this
  -- release's message (SET NX needs no record); one that is gone
  -- without a word keeps no reader out of a free lock.
  redis.call('DEL', KEYS[4], KEYS[5])
end
local granted, fence = '', nil
if mine then
  local ok, record = pcall(cjson.decode, mine)
  if ok and type(record) == 'table' then
    if tonumber(record.granted_at_ms) then
      granted = string.format('%d', tonumber(record.granted_at_ms))
    end
    if record.fence then
      fence = tostring(record.fence)
    end
  end
end
if fence then
  publish_change(ARGV[3], ARGV[2], 'released ' .. fence)
  history_ended(fence, 'released', nil, alone)
else
  publish_change(ARGV[3], ARGV[2], '')
end
return {2, granted}
