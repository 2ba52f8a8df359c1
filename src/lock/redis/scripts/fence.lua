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
  local stored = redis.pcall('GET', counter_key)
  if type(stored) == 'table' and stored.err then
    return nil, stored.err
  end
  local now = redis.call('TIME')
  local fence = now[1] .. string.rep('0', 6 - #now[2]) .. now[2]
  if stored and not (#stored == #fence and stored < fence and not string.find(stored, '%D')) then
    local counter = tonumber(stored)
    if not counter or counter ~= math.floor(counter) then
      return nil, 'not an integer'
    end
    if counter + 1 > tonumber(fence) then
      fence = string.format('%.0f', counter + 1)
    end
  end
  if #fence > 16 or (#fence == 16 and fence > '9007199254740991') then
    return nil, 'at or above 2^53 - 1'
  end
  local stored_ok = redis.pcall('SET', counter_key, fence, 'PX', retention_ms)
  if type(stored_ok) == 'table' and stored_ok.err then
    return nil, stored_ok.err
  end
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
