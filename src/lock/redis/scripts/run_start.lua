-- Start an attempt of a run, renew the one ARGV[1] holds, or answer the
-- result of a done run. One script, so that two first calls can never
-- both start an attempt.
-- KEYS as in run.lua (KEYS[3] the fencing counter).
-- ARGV[1] token, ARGV[2] TTL in ms, ARGV[3] owner ('' = none), ARGV[4] now
-- in Unix ms, ARGV[5] fence retention in ms, ARGV[6] change channel,
-- ARGV[7] PUBLISH or SPUBLISH, ARGV[8] fingerprint ('' = none), ARGV[9]
-- how long the record outlives its attempt's lease, in ms, ARGV[10] the
-- holder's metadata as compact JSON ('' = none),
-- and the history tail (history.lua): KEYS[4] the history list, ARGV[11] to
-- ARGV[13] its length, how long it outlives a lease, and now in Unix ms
-- Returns {4} when the run was started with another fingerprint (nothing
-- changed); {3, fence, attempt, completed_at_ms, result} when it is done;
-- {0, pttl} when another token holds its attempt; {2, fence, attempt} when
-- ARGV[1] held it (its lease reset to ARGV[2]); {1, fence, attempt,
-- took_over} for a new attempt, took_over 1 when the last attempt's lease
-- ran out unfinished.
-- Publishes `acquired FENCE TTL NOW OWNER[\nMETA]` for a new attempt and `extended
-- FENCE TTL NOW` for a renewal (src/lock/change.rs). A new attempt that
-- takes over one whose lease ran out first writes that one's history
-- entry (run.lua).
local rec, err = read_record({'state', 'fingerprint', 'fence', 'attempt'})
if not rec then
  return err
end
local state, fingerprint = rec[1], rec[2]
if ARGV[8] ~= '' and fingerprint and fingerprint ~= ARGV[8] then
  return {4}
end
if state == 'done' then
  local done = read_record({'completed_at_ms', 'result'})
  return {3, rec[3] or '0', rec[4] or '0', done[1] or '0', done[2] or 'null'}
end
local keep = int(tonumber(ARGV[2]) + tonumber(ARGV[9]))
local ends = int(tonumber(ARGV[4]) + tonumber(ARGV[2]))
local current = redis.call('GET', KEYS[1])
if current then
  if current ~= ARGV[1] then
    return {0, redis.call('PTTL', KEYS[1])}
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[2], 'ttl_ms', ARGV[2], 'ends_ms', ends)
  -- A renewal's owner and metadata are shown first (run_inspect.lua);
  -- owner and meta stay the start's, for the attempt's history entry.
  if ARGV[3] ~= '' then
    redis.call('HSET', KEYS[2], 'owner_now', ARGV[3])
  end
  if ARGV[10] ~= '' then
    redis.call('HSET', KEYS[2], 'meta_now', ARGV[10])
  end
  redis.call('PEXPIRE', KEYS[2], keep)
  publish_change(ARGV[7], ARGV[6], 'extended ' .. (rec[3] or '0') .. ' ' .. ARGV[2] .. ' ' .. ARGV[4])
  return {2, rec[3] or '0', rec[4] or '0'}
end
local fence, fence_err = next_fence(KEYS[3], ARGV[5])
if not fence then
  return redis.error_reply('fence counter ' .. KEYS[3] .. ': ' .. fence_err)
end
local took_over = 0
if state == 'running' then
  took_over = 1
  if history_on then
    history_expired('attempt', read_record({'fence', 'started_at_ms', 'ends_ms', 'owner', 'meta'}))
  end
end
if state then
  -- The last attempt's renewal fields go with it.
  redis.call('HDEL', KEYS[2], 'owner_now', 'meta_now')
end
local attempt = (tonumber(rec[4] or '') or 0) + 1
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('HSET', KEYS[2], 'state', 'running', 'fence', int(fence), 'attempt', int(attempt),
  'owner', ARGV[3], 'started_at_ms', ARGV[4], 'ttl_ms', ARGV[2], 'ends_ms', ends, 'meta', ARGV[10])
if not fingerprint and ARGV[8] ~= '' then
  redis.call('HSET', KEYS[2], 'fingerprint', ARGV[8])
end
redis.call('PEXPIRE', KEYS[2], keep)
publish_change(ARGV[7], ARGV[6], 'acquired ' .. int(fence) .. ' ' .. ARGV[2] .. ' ' .. ARGV[4] .. ' ' .. ARGV[3]
  .. meta_line(ARGV[10]))
return {1, int(fence), int(attempt), took_over}
