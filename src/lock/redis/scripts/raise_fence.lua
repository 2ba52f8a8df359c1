-- Redlock: after a grant, raise this node's fencing counter to at least the
-- fence the grant reports, so that the next grant on any quorum that shares
-- a node with this one gets a larger fence. When the token holds the lock
-- here, its recorded fence is set too. The counter is kept for the fence
-- retention from now, as after a grant.
-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] holder metadata hash
-- ARGV[1] token, ARGV[2] fence, ARGV[3] fence retention in ms
-- The history needs nothing more: an exclusive lease's entry is written
-- from the holder hash at its end (history.lua's history_closed).
-- Returns 1 when the token holds the lock here, else 0 (the counter is
-- raised either way).
local current = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if current < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[3], 'fence', ARGV[2])
return 1
