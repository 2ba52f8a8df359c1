-- The shared part of the lock scripts, put in front of each after
-- semaphore.lua (whose prune and expire_with_last keep the shared leases
-- as they keep permits). Beside the exclusive lock key `{name}` and its
-- `:meta` hash, a lock held in shared mode has, under the same hash tag:
--   `{name}:shared`   a sorted set: token -> the lease's expiry, in µs of
--                     this server's clock;
--   `{name}:readers`  a hash: 't:' .. token -> a JSON record {fence,
--                     owner, granted_at_ms, ttl_ms} (the fence a string);
--   `{name}:writers`  a sorted set: token -> when the exclusive request
--                     of that token stops waiting, in µs: while one is
--                     there, no new shared lease is granted (the writer
--                     rule), so readers never starve a writer.
-- An exclusive holder and a shared lease are never live at once: the
-- exclusive script grants only when no shared lease is live, the shared
-- one only when the lock key is absent.

-- How many shared leases are live, forgetting (and telling of) those
-- that ran out; 0 at the cost of one EXISTS when there are none.
local function live_shared(shared, readers, channel, publish)
  if redis.call('EXISTS', shared) == 0 then
    return 0
  end
  return prune(shared, readers, now_us(), channel, publish)
end

-- Milliseconds until the last live shared lease ends (at least 1).
local function last_shared_ms(shared)
  local last = redis.call('ZRANGE', shared, '-1', '-1', 'WITHSCORES')
  if #last < 2 then
    return 1
  end
  return math.max(1, math.ceil((tonumber(last[2]) - now_us()) / 1000))
end

-- Records that `token`'s exclusive request waits `wait_ms` more (nothing
-- when it does not wait), for as long as it waits but no longer than a
-- second past the end of the last shared lease (`shared`) it waits for: a
-- writer that is still there tries again by then (the lease's end, or an
-- extend's message, wakes it) and records itself anew, while one that is
-- gone without a word (a client that hung up with its own token, a lockd
-- that stopped) keeps readers out no longer than that. Keeps the set for
-- as long as its last record.
local function note_writer(writers, token, wait_ms, shared)
  local wait = tonumber(wait_ms)
  if not wait or wait <= 0 then
    return
  end
  local now = now_us()
  local until_us = now + us(wait)
  local last = redis.call('ZRANGE', shared, '-1', '-1', 'WITHSCORES')
  if #last == 2 then
    until_us = math.min(until_us, tonumber(last[2]) + 1000000)
  end
  redis.call('ZREMRANGEBYSCORE', writers, '-inf', int(now))
  redis.call('ZADD', writers, int(until_us), token)
  local last = redis.call('ZRANGE', writers, '-1', '-1', 'WITHSCORES')
  redis.call('PEXPIRE', writers, int(math.floor((tonumber(last[2]) - now) / 1000) + 1))
end

-- Milliseconds until the last waiting writer stops waiting, or nil when
-- none waits; `now` in µs of this server's clock (read here when nil).
local function writer_waits_ms(writers, now)
  now = now or now_us()
  local last = redis.call('ZRANGE', writers, '-1', '-1', 'WITHSCORES')
  if #last < 2 or tonumber(last[2]) <= now then
    return nil
  end
  return math.max(1, math.ceil((tonumber(last[2]) - now) / 1000))
end
