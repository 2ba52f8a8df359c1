-- The shared part of the semaphore scripts, put in front of each (after
-- fence.lua). A semaphore is three keys under one hash tag:
--   permits  a sorted set: token -> the permit's expiry, in µs of this
--            server's clock (TIME): in whole ms, a permit taken at 10.9 ms
--            for 100 ms would run out at 110 ms, 0.9 ms early;
--   holders  a hash: 'limit' -> the limit set by the first permit, and
--            't:' .. token -> a JSON record {fence, owner, granted_at_ms,
--            ttl_ms}
--            (the fence as a string: 16 digits do not fit a Lua number's
--            JSON encoding).
-- Put after history.lua and tell.lua, whose `tell` publishes and records
-- each change.
-- Every script first forgets the permits that ran out (prune), so that an
-- expired permit is free at once for every instance, with no cleanup job,
-- and both keys expire a second after the last permit.

-- This server's clock, in µs.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A TTL in ms, in µs.
local function us(ms)
  return ms * 1000
end

-- Forgets the permits that ran out by `now`, publishing `expired FENCE`
-- for each on `channel` with `publish` (PUBLISH or SPUBLISH), before the
-- calling script's own change (src/lock/change.rs); returns how many are
-- held.
local function prune(permits, holders, now, channel, publish)
  local upto = int(now)
  local gone = redis.call('ZRANGEBYSCORE', permits, '-inf', upto)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', permits, '-inf', upto)
    -- In slices: unpack() of thousands of values overflows Lua's stack.
    for first = 1, #gone, 500 do
      local fields = {}
      for i = first, math.min(first + 499, #gone) do
        fields[#fields + 1] = 't:' .. gone[i]
      end
      local records = redis.call('HMGET', holders, unpack(fields))
      for i = 1, #fields do
        local record = records[i]
        if record then
          local ok, decoded = pcall(cjson.decode, record)
          if ok and type(decoded) == 'table' and decoded.fence then
            tell(publish, channel, 'expired ' .. tostring(decoded.fence))
          end
        end
      end
      redis.call('HDEL', holders, unpack(fields))
    end
  end
  local held = redis.call('ZCARD', permits)
  if held == 0 then
    redis.call('DEL', holders)
  end
  return held
end

-- Makes both keys live as long as the longest permit and one second more:
-- a script that runs in that second still finds the permits that ran out,
-- and forgets them saying so (`expired FENCE`, before its own change),
-- where keys that Redis expired would vanish without a word, and a watcher
-- could hear the next permit granted before the last one ran out.
local function expire_with_last(permits, holders, now)
  local last = redis.call('ZRANGE', permits, '-1', '-1', 'WITHSCORES')
  if #last == 2 then
    -- In whole ms, rounded up, and the second after the last permit.
    local left = int(math.floor((tonumber(last[2]) - now) / 1000) + 1001)
    redis.call('PEXPIRE', permits, left)
    redis.call('PEXPIRE', holders, left)
  end
end

-- The holders hash field of `token`.
local function holder_field(token)
  return 't:' .. token
end

-- Resets `token`'s lease to `ttl` ms from `now`: its expiry in `permits`,
-- its `record` (decoded, its TTL set here) in `holders`, and both keys'
-- life (expire_with_last). For a renewal and an extend alike.
local function reset_lease(permits, holders, token, record, ttl, now)
  record.ttl_ms = ttl
  redis.call('ZADD', permits, 'XX', int(now + us(ttl)), token)
  redis.call('HSET', holders, holder_field(token), cjson.encode(record))
  expire_with_last(permits, holders, now)
end

-- An admin's break (DELETE ...?force=true): ends the live leases in
-- `leases` (a permit set, or a lock's shared leases) whose fence is
-- `fence` ('' = every one), whatever their token, publishing `broken
-- FENCE BY` for each; appends {fence, mode, owner, meta} of each to
-- `out`. Call prune first: what ran out is not broken but expired.
local function break_leases(leases, records, fence, by, channel, publish, mode, out)
  for _, token in ipairs(redis.call('ZRANGE', leases, '0', '-1')) do
    local field = holder_field(token)
    local ok, record = pcall(cjson.decode, redis.call('HGET', records, field) or '')
    if ok and type(record) == 'table' and record.fence then
      local this = tostring(record.fence)
      if fence == '' or this == fence then
        redis.call('ZREM', leases, token)
        redis.call('HDEL', records, field)
        local n = #out
        out[n + 1], out[n + 2], out[n + 3], out[n + 4] = this, mode, record.owner or '', record.meta or ''
        tell(publish, channel, 'broken ' .. this .. ' ' .. by)
      end
    end
  end
end
