-- Acquire a lock exclusively: SET NX PX and the next fence in one script,
-- so a grant and its fence can never be separated. Put after fence.lua and
-- history.lua; the shared-lease rules (tell.lua, semaphore.lua, shared.lua)
-- take the place of the `-- @shared-rules` line, so that a lock that was
-- never shared does not pay for defining them (docs/performance.md).
-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] holder metadata hash,
-- KEYS[4] shared leases, KEYS[5] their records, KEYS[6] waiting writers
-- (see shared.lua)
-- ARGV[1] token, ARGV[2] TTL in ms (>= 1), ARGV[3] owner label ('' = none),
-- ARGV[4] grant time in Unix ms, ARGV[5] fence retention in ms (>= 1000),
-- ARGV[6] change channel (KEYS[1] .. ':released'), ARGV[7] the command to
-- publish with: PUBLISH, or SPUBLISH on a Redis Cluster, ARGV[8] how much
-- longer the request waits, in ms ('' or 0: it does not wait), ARGV[9] '1'
-- to renew only (a free lock is not granted: answered {0, -2}),
-- ARGV[10] the holder's metadata as compact JSON ('' = none), ARGV[11]
-- the lease's end by this grant or renewal (ARGV[4] + ARGV[2]), in Unix ms,
-- ARGV[12] how long the holder hash is kept, in ms: the TTL, and while the
-- history is on the fence retention after it (holder_keep_ms, history.lua),
-- and the history tail (history.lua): KEYS[7] the history list, ARGV[13] to
-- ARGV[15] its length, how long it outlives a lease, and now in Unix ms
-- Returns {1, fence} (the fence as a decimal string) for a new grant,
-- {2, fence} when this token already
-- held the lock (its lease is reset to the TTL, the fence is unchanged, the
-- owner label and metadata replaced when given), {0, pttl} when another token
-- holds it (pttl -1: its key has no TTL, set by a client other than lockd)
-- or shared leases are live (pttl: until the last of them ends),
-- {3, 0} when this token holds a shared lease (nothing is changed).
-- A request that waits and is refused for shared leases is recorded among
-- the waiting writers (until its wait ends, or a second after the last
-- shared lease, whichever is first: see note_writer), so that no new
-- shared lease is granted meanwhile and the shared leases drain; a grant
-- forgets it. (One
-- refused for an exclusive holder is not: at that holder's release it
-- races new shared requests once at most, and if they win, it is refused
-- for shared leases and recorded.)
-- Publishes the change (src/lock/change.rs): `acquired FENCE TTL GRANTED
-- OWNER[\nMETA]` for a new grant, `extended FENCE TTL AT` for a renewal (AT: the
-- grant time of this request, ARGV[4]).
--
-- The fence comes from next_fence (fence.lua, put in front of this
-- script): max(counter + 1, this server's clock in microseconds), the
-- counter kept for the fence retention after the last grant.
-- A lock that a foreign client set without a fence gets one when its
-- holder renews it, so every lease has a fence.
--
-- Redis does not roll a script back, so when the counter or the hash cannot
-- be written (a foreign client left a key of another type there), the lock
-- is deleted again before the error is returned: no half-written grant.
-- The exclusive rules, once no shared lease is live: a grant, a renewal
-- of this token's lease, or a refusal. `shared_kept`: whether the shared
-- leases' or the waiting writers' key exists (a grant forgets this
-- token's wait); `holder_kept`: whether the holder hash may exist (a
-- grant first writes the entry of the lease it held, which ran out:
-- history_lapsed).
local function exclusive(shared_kept, holder_kept)
  if ARGV[9] ~= '1' and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    if shared_kept then
      redis.call('ZREM', KEYS[6], ARGV[1])
    end
    if holder_kept then
      history_lapsed(KEYS[3])
      -- The lease's hash goes whole: a renewal's fields (owner_now,
      -- meta_now) must not outlive it.
      redis.pcall('DEL', KEYS[3])
    end
    local fence, err = next_fence(KEYS[2], ARGV[5])
    if not fence then
      redis.call('DEL', KEYS[1])
      return redis.error_reply('fence counter ' .. KEYS[2] .. ': ' .. err)
    end
    -- No key is left where the hash goes (the EXISTS before the call saw
    -- none, or holder_kept deleted it, a key of another type included).
    local meta = redis.pcall('HSET', KEYS[3], 'fence', fence, 'owner', ARGV[3],
      'granted_at_ms', ARGV[4], 'ttl_ms', ARGV[2], 'ends_ms', ARGV[11], 'meta', ARGV[10])
    if type(meta) == 'table' and meta.err then
      redis.call('DEL', KEYS[1])
      return redis.error_reply('holder metadata ' .. KEYS[3] .. ': ' .. meta.err)
    end
    redis.call('PEXPIRE', KEYS[3], ARGV[12])
    publish_change(ARGV[7], ARGV[6], 'acquired ' .. fence .. ' ' .. ARGV[2] .. ' ' .. ARGV[4]
      .. ' ' .. ARGV[3] .. meta_line(ARGV[10]))
    return {1, fence}
  end
  if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    local fence = redis.pcall('HGET', KEYS[3], 'fence')
    if type(fence) == 'table' and fence.err then
      return redis.error_reply('holder metadata ' .. KEYS[3] .. ': ' .. fence.err)
    end
    if not (fence and string.find(fence, '^%d+$')) then
      local err
      fence, err = next_fence(KEYS[2], ARGV[5])
      if not fence then
        return redis.error_reply('fence counter ' .. KEYS[2] .. ': ' .. err)
      end
      redis.call('HSET', KEYS[3], 'fence', fence, 'granted_at_ms', ARGV[4])
    end
    -- A renewal's owner and metadata replace the grant's for GET
    -- (inspect.lua reads these first); `owner` and `meta` stay the
    -- grant's, for the lease's history entry.
    if ARGV[3] ~= '' then
      redis.call('HSET', KEYS[3], 'owner_now', ARGV[3])
    end
    if ARGV[10] ~= '' then
      redis.call('HSET', KEYS[3], 'meta_now', ARGV[10])
    end
    redis.call('HSET', KEYS[3], 'ttl_ms', ARGV[2], 'ends_ms', ARGV[11])
    redis.call('PEXPIRE', KEYS[3], ARGV[12])
    publish_change(ARGV[7], ARGV[6], 'extended ' .. fence .. ' ' .. ARGV[2] .. ' ' .. ARGV[4])
    return {2, fence}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end

-- One EXISTS tells a lock that was never shared (and has no waiting
-- writer), and whose holder hash is gone (the lease was released, or
-- never granted), from one that needs a closer look.
if redis.call('EXISTS', KEYS[4], KEYS[6], KEYS[3]) == 0 then
  return exclusive(false, false)
end
if redis.call('EXISTS', KEYS[4], KEYS[6]) == 0 then
  return exclusive(false, true)
end
-- @shared-rules
local readers = live_shared(KEYS[4], KEYS[5], ARGV[6], ARGV[7])
if readers > 0 then
  if redis.call('ZSCORE', KEYS[4], ARGV[1]) then
    return {3, 0}
  end
  note_writer(KEYS[6], ARGV[1], ARGV[8], KEYS[4])
  return {0, last_shared_ms(KEYS[4])}
end
return exclusive(true, true)
