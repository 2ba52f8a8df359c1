-- The shared part of the run scripts (run_*.lua), put in front of each.
-- A run of key K has three keys under one hash tag (see src/lock/redis/runs.rs):
-- KEYS[1] the attempt (a string holding the live attempt's token, with the
-- attempt's lease as its TTL), KEYS[2] the record (a hash: state 'running',
-- 'done' or 'abandoned', attempt, fence, owner, started_at_ms, ttl_ms,
-- ends_ms (the attempt's lease end by its start, renewal or extend, in
-- Unix ms), meta, fingerprint; owner_now and meta_now when a renewal gave
-- others (shown first, while owner and meta stay the start's, for the
-- history); when done also result, completed_at_ms and done_by, the
-- SHA-1 of the completing token), and for run_start.lua KEYS[3] the
-- fencing counter. A record whose state is 'running' without an attempt
-- key is one whose lease ran out.
-- The record is also the attempt's history entry while the attempt lasts
-- (history.lua): the entry is written to the list once, when the attempt
-- ends (completed, abandoned, broken), or for an attempt that ran out,
-- by the next start (history_expired); a read of the history builds the
-- live or lapsed attempt's entry from the record.

-- The record's fields `names`, or an error reply when the record is not a
-- hash (a foreign client's key).
local function read_record(names)
  local rec = redis.pcall('HMGET', KEYS[2], unpack(names))
  if type(rec) == 'table' and rec.err then
    return nil, redis.error_reply('run record ' .. KEYS[2] .. ': ' .. rec.err)
  end
  return rec
end

-- Whole numbers are written with `int` (history.lua).
