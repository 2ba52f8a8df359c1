-- Break a run's attempt: end it whatever the token, for an admin (DELETE
-- /runs/{key}?force=true). The run is pending again, as after an
-- abandonment: nothing is stored, and the next start is a new attempt.
-- KEYS as in run.lua, and KEYS[3] the history list
-- ARGV[1] the fence of the attempt to end ('' = the live one), ARGV[2]
-- the id of the key that breaks it, ARGV[3] change channel, ARGV[4]
-- PUBLISH or SPUBLISH, and the history tail (history.lua): ARGV[5] to
-- ARGV[7]. The record keeps its TTL (the attempt's lease and the run
-- retention past it): no longer than a running record would have.
-- Publishes `broken FENCE BY`, and writes the attempt's history entry
-- (run.lua).
-- Returns {fence, 'attempt', owner, meta} of the attempt ended; empty when
-- no attempt is live (or another fence holds it).
local rec, err = read_record({'state', 'fence', 'owner', 'meta', 'started_at_ms', 'ends_ms',
  'owner_now', 'meta_now'})
if not rec then
  return err
end
local fence = rec[2] or '0'
if rec[1] ~= 'running' or redis.call('EXISTS', KEYS[1]) == 0
    or (ARGV[1] ~= '' and ARGV[1] ~= fence) then
  return {}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[2], 'state', 'abandoned')
publish_change(ARGV[4], ARGV[3], 'broken ' .. fence .. ' ' .. ARGV[2])
history_closed(rec[2], 'attempt', rec[5], rec[6], rec[3], rec[4], 'broken', history_now, ARGV[2])
return {fence, 'attempt', rec[7] or rec[3] or '', rec[8] or rec[4] or ''}
