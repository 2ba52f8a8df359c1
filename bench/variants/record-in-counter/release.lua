-- A measured design, not lockd's: the exclusive release with the holder's
-- record in the fence counter, KEYS[2] (run with RECORD_KEY=:fence; see
-- acquire.lua beside it). Only an exclusive holder's release is written
-- out. The entry is the record with `exclusive` after its fence and
-- `released AT_MS` after its lease end.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  local record = redis.pcall('GET', KEYS[2])
  redis.call('DEL', KEYS[1])
  if type(record) == 'string' and #record > 16 then
    local fence = string.sub(record, 1, 16)
    publish_change(ARGV[3], ARGV[2], 'released ' .. fence)
    if history_on then
      local nl = string.find(record, '\n', 18, true)
      local held = redis.pcall('LPUSH', history_key, fence .. ' exclusive'
        .. string.sub(record, 17, nl - 1) .. ' released ' .. history_now .. string.sub(record, nl))
      if type(held) == 'number' and held > 2 and held > 2 * history_size() then
        redis.pcall('LTRIM', history_key, 0, history_size() - 1)
      end
      history_keep_for(0)
    end
    return {1, string.sub(record, 18, 30)}
  end
  publish_change(ARGV[3], ARGV[2], '')
  return {1, ''}
end
-- @shared-rules
return {0, ''}
