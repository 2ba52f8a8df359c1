-- A measured design, not lockd's: the exclusive acquire with the holder's
-- record kept in the fence counter (KEYS[2]) instead of a holder hash
-- (KEYS[3], unused here), for bench/script-instructions.sh (see
-- README.md beside it). Only the path a grant of a free lock takes is
-- written out: a renewal, and a counter at or ahead of the clock, are not.
-- The counter holds `FENCE GRANTED_MS ENDS_MS\nOWNER\nMETA`: one
-- `SET ... PX ... GET` stores the next fence and the record, and answers
-- the last lease's record. Fences (16 digits until 2286) and Unix ms (13
-- digits) have fixed widths, so the record is cut, not parsed. When the
-- last lease's end has passed, the history's head tells whether its
-- release wrote its entry; if not, it expired and its entry is written
-- now (a release writes no mark in the counter).
local function next_fence_record(counter_key, tail, keep_ms)
  local now = redis.call('TIME')
  local fence = now[1] .. string.rep('0', 6 - #now[2]) .. now[2]
  local stored = redis.pcall('SET', counter_key, fence .. tail, 'PX', keep_ms, 'GET')
  if type(stored) == 'table' and stored.err then
    return nil, stored.err
  end
  if not stored then
    return fence, false
  end
  local last = string.sub(stored, 1, 16)
  if #last == 16 and last < fence and not string.find(last, '%D') then
    return fence, stored
  end
  return nil, 'a counter at or ahead of the clock: not in this variant'
end

local function exclusive(shared_kept)
  if ARGV[9] ~= '1' and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    if shared_kept then
      redis.call('ZREM', KEYS[6], ARGV[1])
    end
    local fence, stored = next_fence_record(KEYS[2], ' ' .. ARGV[4] .. ' ' .. ARGV[11] .. '\n'
      .. ARGV[3] .. '\n' .. ARGV[10], ARGV[12])
    if not fence then
      redis.call('DEL', KEYS[1])
      return redis.error_reply('fence counter ' .. KEYS[2] .. ': ' .. stored)
    end
    if stored and #stored > 16 and history_on then
      local ends = string.sub(stored, 32, 44)
      if ends <= history_now then
        local head = redis.pcall('LINDEX', history_key, 0)
        if not (type(head) == 'string' and string.sub(head, 1, 16) == string.sub(stored, 1, 16)) then
          local nl = string.find(stored, '\n', 18, true)
          redis.pcall('LPUSH', history_key, string.sub(stored, 1, 16) .. ' exclusive'
            .. string.sub(stored, 17, nl - 1) .. ' expired ' .. ends .. string.sub(stored, nl))
          history_keep_for(0)
        end
      end
    end
    publish_change(ARGV[7], ARGV[6], 'acquired ' .. fence .. ' ' .. ARGV[2] .. ' ' .. ARGV[4]
      .. ' ' .. ARGV[3] .. meta_line(ARGV[10]))
    return {1, fence}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end

if redis.call('EXISTS', KEYS[4], KEYS[6]) == 0 then
  return exclusive(false)
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
return exclusive(true)
