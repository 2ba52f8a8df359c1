-- Release a lock and grant it to the next waiter in the same step: the
-- bodies of release.lua and acquire.lua (each made a function of its own
-- KEYS and ARGV in front of this part, see handoff_source in mod.rs),
-- run one after the other, so that a handoff costs one script and one
-- round trip, not a release, a change message and the waiter's acquire.
-- KEYS: acquire.lua's (KEYS[1] lock key, KEYS[2] fencing counter,
-- KEYS[3] holder metadata hash, KEYS[4] shared leases, KEYS[5] their
-- records, KEYS[6] waiting writers, KEYS[7] the history list)
-- ARGV: acquire.lua's ARGV[1] to ARGV[12] for the waiter, then ARGV[13]
-- the releasing token, and the history tail (ARGV[14] to ARGV[16]).
-- release.lua's keys are acquire.lua's but the fencing counter; its
-- channel and publish command are acquire.lua's ARGV[6] and ARGV[7].
-- Returns release.lua's answer (verdict, grant time), and when it
-- released an exclusive holder (1) acquire.lua's status and fence after
-- it, as strings: {1, granted, status, fence}; {1, granted, 'err',
-- message} when the grant failed (the lock is then free: acquire.lua
-- deleted it again); {verdict, granted, '', ''} when no grant was tried
-- (not released, a shared lease released, or another listener).
-- Both publish their changes as they would alone: `released F`, then
-- `acquired ...`.
-- The waiter is granted only when no other lockd instance (nor any other
-- client) listens to the lock's changes: one that listens may have
-- waiters of its own, which must not wait behind this instance's for ever.
-- Then the lock is only released, and every instance's head tries at its
-- message, as at any release. This instance's own subscription, if made
-- yet, is the one listener allowed.
local listeners
if ARGV[7] == 'SPUBLISH' then
  listeners = redis.pcall('PUBSUB', 'SHARDNUMSUB', ARGV[6])
else
  listeners = redis.pcall('PUBSUB', 'NUMSUB', ARGV[6])
end
local alone = type(listeners) == 'table' and (tonumber(listeners[2]) or 2) <= 1
local released = release_part(
  {KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]},
  {ARGV[13], ARGV[6], ARGV[7], ARGV[14], ARGV[15], ARGV[16]})
if released[1] ~= 1 or not alone then
  return {released[1], released[2], '', ''}
end
local granted = acquire_part(KEYS, ARGV)
if granted.err then
  return {1, released[2], 'err', granted.err}
end
return {1, released[2], tostring(granted[1]), tostring(granted[2])}
