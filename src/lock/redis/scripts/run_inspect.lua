-- Read a run's state in one atomic step (never its token).
-- KEYS as in run.lua.
-- Returns {0} when the run is unknown; {3, fence, attempt,
-- completed_at_ms, result} when done; {1, fence, attempt, pttl, owner,
-- started_at_ms, meta} while an attempt holds it; {2, fence, attempt, how}
-- when pending, how 'abandoned' or 'expired'.
local rec, err = read_record({'state', 'fence', 'attempt', 'owner', 'started_at_ms',
  'completed_at_ms', 'result', 'meta', 'owner_now', 'meta_now'})
if not rec then
  return err
end
if not rec[1] then
  return {0}
end
local fence, attempt = rec[2] or '0', rec[3] or '0'
if rec[1] == 'done' then
  return {3, fence, attempt, rec[6] or '0', rec[7] or 'null'}
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then
  return {1, fence, attempt, pttl, rec[9] or rec[4] or '', rec[5] or '0', rec[10] or rec[8] or ''}
end
if rec[1] == 'abandoned' then
  return {2, fence, attempt, 'abandoned'}
end
return {2, fence, attempt, 'expired'}
