-- Extend a run's attempt: compare the token, then PEXPIRE. Never starts
-- an attempt.
-- KEYS as in run.lua.
-- ARGV[1] token, ARGV[2] new TTL in ms ('' = the attempt's own), ARGV[3]
-- the TTL when ARGV[2] is '' and none is recorded, ARGV[4] how long the
-- record outlives the lease, in ms, ARGV[5] change channel, ARGV[6]
-- PUBLISH or SPUBLISH, ARGV[7] now in Unix ms,
-- and the history tail (history.lua): KEYS[3] the history list, ARGV[8] to
-- ARGV[10] its length, how long it outlives a lease, and now in Unix ms
-- Returns {1, fence, attempt, ttl_ms} when extended; {0} when the run is
-- unknown; {-1} when ARGV[1] does not hold its live attempt; {-2} when the
-- run is done. Publishes `extended FENCE TTL NOW`.
local rec, err = read_record({'state', 'fence', 'attempt', 'ttl_ms'})
if not rec then
  return err
end
if not rec[1] then
  return {0}
end
if rec[1] == 'done' then
  return {-2}
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {-1}
end
local ttl = ARGV[2]
if ttl == '' then
  ttl = rec[4]
  if not tonumber(ttl or '') then
    ttl = ARGV[3]
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('HSET', KEYS[2], 'ttl_ms', ttl, 'ends_ms', int(tonumber(ARGV[7]) + tonumber(ttl)))
redis.call('PEXPIRE', KEYS[2], int(tonumber(ttl) + tonumber(ARGV[4])))
publish_change(ARGV[6], ARGV[5], 'extended ' .. (rec[2] or '0') .. ' ' .. ttl .. ' ' .. ARGV[7])
return {1, rec[2] or '0', rec[3] or '0', ttl}
