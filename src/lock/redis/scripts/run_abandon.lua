-- Abandon a run's attempt: compare the token, delete the attempt, store
-- nothing (a failure is never replayed). The run is pending again.
-- KEYS as in run.lua.
-- ARGV[1] token, ARGV[2] how long the record is kept now, in ms, ARGV[3]
-- change channel, ARGV[4] PUBLISH or SPUBLISH,
-- and the history tail (history.lua): KEYS[3] the history list, ARGV[5] to
-- ARGV[7] its length, how long it outlives a lease, and now in Unix ms
-- Returns {1} when abandoned; {0} when the run is unknown; {-1} when
-- ARGV[1] does not hold its live attempt; {-2} when the run is done.
-- Publishes `released FENCE`, and writes the attempt's history entry
-- (run.lua).
local rec, err = read_record({'state', 'fence', 'started_at_ms', 'ends_ms', 'owner', 'meta'})
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
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[2], 'state', 'abandoned')
redis.call('PEXPIRE', KEYS[2], ARGV[2])
publish_change(ARGV[4], ARGV[3], 'released ' .. (rec[2] or '0'))
history_closed(rec[2], 'attempt', rec[3], rec[4], rec[5], rec[6], 'abandoned', history_now)
return {1}
