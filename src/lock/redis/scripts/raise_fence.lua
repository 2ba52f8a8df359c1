-- Redlock: after a grant, raise this node's fencing counter to at least the
-- fence the grant reports, so that the next grant on any quorum that shares
-- a node with this one gets a larger fence. When the token holds the lock
-- here, its recorded fence is set too. The counter is kept for the fence
-- retention from now, as after a grant.
-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] holder metadata hash
-- ARGV[1] token, ARGV[2] fence, ARGV[3] fence retention in ms, and the
-- history tail (history.lua, put in front): KEYS[4], ARGV[4] to ARGV[6]
-- (the holder's history entry takes the new fence)
-- Returns 1 when the token holds the lock here, else 0 (the counter is
-- raised either way).
-- Renames the open entry of fence `old` to `new`: Redlock raised the
-- fence of a grant whose nodes disagreed (raise_fence.lua).
local function history_refence(old, new)
  if not history_on then
    return
  end
  local index, head, expires, body = history_open(old)
  if index then
    local rest = string.match(head, '^%d+( .*)$')
    redis.pcall('LSET', history_key, index, new .. rest .. ' ' .. expires .. body)
  end
end
local current = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if current < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local before = redis.call('HGET', KEYS[3], 'fence')
redis.call('HSET', KEYS[3], 'fence', ARGV[2])
if before and before ~= ARGV[2] then
  history_refence(before, ARGV[2])
end
return 1
