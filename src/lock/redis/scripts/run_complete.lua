-- Complete a run: only the token of its live attempt may, and the result
-- is kept for ARGV[4] ms. A token that completed it already (a retry after
-- a lost answer) gets the stored run, unchanged.
-- KEYS as in run.lua.
-- ARGV[1] token, ARGV[2] result (JSON text), ARGV[3] now in Unix ms,
-- ARGV[4] retention in ms, ARGV[5] change channel, ARGV[6] PUBLISH or
-- SPUBLISH,
-- and the history tail (history.lua): KEYS[3] the history list, ARGV[7] to
-- ARGV[9] its length, how long it outlives a lease, and now in Unix ms
-- Returns {1, fence, attempt} when completed now; {2, fence, attempt,
-- completed_at_ms, result} when ARGV[1] had completed it; {0} when the run
-- is unknown; {-1} when ARGV[1] does not hold its live attempt; {-2} when
-- another attempt completed it. Publishes `completed FENCE`, and writes
-- the attempt's history entry (run.lua).
local rec, err = read_record({'state', 'fence', 'attempt', 'started_at_ms', 'ends_ms', 'owner',
  'meta'})
if not rec then
  return err
end
if not rec[1] then
  return {0}
end
if rec[1] == 'done' then
  local done = read_record({'completed_at_ms', 'result', 'done_by'})
  if done[3] == redis.sha1hex(ARGV[1]) then
    return {2, rec[2] or '0', rec[3] or '0', done[1] or '0', done[2] or 'null'}
  end
  return {-2}
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {-1}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[2], 'state', 'done', 'result', ARGV[2], 'completed_at_ms', ARGV[3],
  'done_by', redis.sha1hex(ARGV[1]))
redis.call('PEXPIRE', KEYS[2], ARGV[4])
publish_change(ARGV[6], ARGV[5], 'completed ' .. (rec[2] or '0'))
history_closed(rec[2], 'attempt', rec[4], rec[5], rec[6], rec[7], 'completed', history_now)
return {1, rec[2] or '0', rec[3] or '0'}
