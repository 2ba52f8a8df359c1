-- The fencing rule, put in front of the scripts that give fences
-- (acquire.lua, extend.lua); src/lock/fence.rs states the same rule.
-- next_fence(counter_key, retention_ms) returns the next fence of a lock,
-- max(counter + 1, this server's clock in microseconds), as a decimal
-- string, after storing it in counter_key for retention_ms; or nil and the
-- reason when the counter is not an integer or the fence would pass
-- 2^53 - 1. Fences strictly increase, and stay above earlier ones after the
-- counter is lost, as long as this server's clock has not stepped back. A
-- counter an older lockd left without a TTL gets one here.
-- Numbers and strings are converted only when the counter is at or ahead
-- of the clock: each conversion costs Redis more than a command does
-- (docs/performance.md). The clock's 16 digits (until the year 2286) and a
-- counter of as many digits compare as strings as they do as numbers.
local function next_fence(counter_key, retention_ms)
  local now = redis.call('TIME')
  local fence = now[1] .. string.rep('0', 6 - #now[2]) .. now[2]
  -- The clock is stored at once (SET ... GET answers the counter it
  -- replaced): the common case, a counter behind the clock, takes one
  -- command. Otherwise the counter is put right below, in this same
  -- atomic step.
  local stored = redis.pcall('SET', counter_key, fence, 'PX', retention_ms, 'GET')
  if type(stored) == 'table' and stored.err then
    return nil, stored.err
  end
  if not stored or (#stored == #fence and stored < fence and not string.find(stored, '%D')) then
    return fence
  end
  local counter = tonumber(stored)
  local err
  if not counter or counter ~= math.floor(counter) then
    err = 'not an integer'
  elseif counter + 1 > tonumber(fence) then
    fence = string.format('%.0f', counter + 1)
    if #fence > 16 or (#fence == 16 and fence > '9007199254740991') then
      err = 'at or above 2^53 - 1'
    end
  end
  if err then
    -- The counter as it was, never lower.
    redis.call('SET', counter_key, stored, 'PX', retention_ms)
    return nil, err
  end
  redis.call('SET', counter_key, fence, 'PX', retention_ms)
  return fence
end


-- The holder's metadata as the change messages carry it: after a newline
-- (an owner label has no control character), nothing when there is none
-- (src/lock/change.rs).
local function meta_line(meta)
  if meta == '' then
    return ''
  end
  return '\n' .. meta
end
