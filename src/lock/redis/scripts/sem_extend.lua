-- Extend the permit `token` holds to a new TTL; never recreates one.
-- Publishes `extended FENCE TTL AT` on the change channel (a shorter lease
-- frees the permit sooner), so that waiters look again and watchers hear it.
-- KEYS[1] permits, KEYS[2] holders
-- ARGV[1] token, ARGV[2] TTL in ms ('' = the permit's own TTL: the one it
-- was granted with or last extended to), ARGV[3] release channel,
-- ARGV[4] PUBLISH or SPUBLISH, ARGV[5] the TTL in ms when neither is
-- known (a record written without one), ARGV[6] when the extend was sent,
-- in Unix ms,
-- and the history tail (history.lua): KEYS[3] the history list, ARGV[7] to
-- ARGV[9] its length, how long it outlives a lease, and now in Unix ms
-- Returns {1, fence, limit, ttl_ms} when extended, {0, '', 0, 0} when
-- `token` holds no permit (given back or run out).
history_mode = 'permit'
local permits, holders = KEYS[1], KEYS[2]
local token = ARGV[1]
local now = now_us()
prune(permits, holders, now, ARGV[3], ARGV[4])
local mine = redis.call('HGET', holders, holder_field(token))
if not (mine and redis.call('ZSCORE', permits, token)) then
  return {0, '', 0, 0}
end
local record = cjson.decode(mine)
local ttl = tonumber(ARGV[2]) or tonumber(record.ttl_ms) or tonumber(ARGV[5])
reset_lease(permits, holders, token, record, ttl, now)
tell(ARGV[4], ARGV[3], 'extended ' .. tostring(record.fence or '') .. ' ' .. string.format('%.0f', ttl)
  .. ' ' .. ARGV[6])
return {1, record.fence, tonumber(redis.call('HGET', holders, 'limit')), ttl}
