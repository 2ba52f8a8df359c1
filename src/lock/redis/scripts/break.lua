-- Break a lock: end its live lease (or shared leases) whatever the token,
-- for an admin (DELETE /locks/{name}?force=true). Put after history.lua,
-- semaphore.lua and shared.lua.
-- KEYS[1] lock key, KEYS[2] holder metadata hash, KEYS[3] shared leases,
-- KEYS[4] their records, KEYS[5] waiting writers (see shared.lua),
-- KEYS[6] the history list
-- ARGV[1] the fence of the one lease to end ('' = every live one),
-- ARGV[2] the id of the key that breaks it, ARGV[3] change channel,
-- ARGV[4] PUBLISH or SPUBLISH, and the history tail (history.lua):
-- ARGV[5] to ARGV[7]
-- Publishes `broken FENCE BY` for each lease ended, so that waiters wake
-- and watchers hear it, and the history records who broke it. The next
-- grant's fence is larger, as after any end.
-- Returns {fence, mode, owner, meta, ...} of each lease ended (fence ''
-- for a lock a foreign client set without one); empty when none matched.
local out = {}
if redis.call('EXISTS', KEYS[1]) == 1 then
  local meta = redis.pcall('HMGET', KEYS[2], 'fence', 'owner', 'meta', 'granted_at_ms', 'ends_ms',
    'owner_now', 'meta_now')
  if type(meta) ~= 'table' or meta.err then
    meta = {}
  end
  local fence = meta[1] or ''
  if ARGV[1] == '' or fence == ARGV[1] then
    redis.call('DEL', KEYS[1], KEYS[2])
    out = {fence, 'exclusive', meta[6] or meta[2] or '', meta[7] or meta[3] or ''}
    publish_change(ARGV[4], ARGV[3], 'broken ' .. fence .. ' ' .. ARGV[2])
    history_closed(meta[1], 'exclusive', meta[4], meta[5], meta[2], meta[3], 'broken', history_now, ARGV[2])
  end
  return out
end
if live_shared(KEYS[3], KEYS[4], ARGV[3], ARGV[4]) == 0 then
  return out
end
break_leases(KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'shared', out)
if redis.call('ZCARD', KEYS[3]) == 0 then
  -- The last shared lease: the waiting writers go with it, as at a release.
  redis.call('DEL', KEYS[4], KEYS[5])
end
return out
