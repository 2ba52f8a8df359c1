-- The history of a name (src/lock/history.rs), put in front of every
-- script that publishes a change: `tell` publishes a change message and
-- folds it into the name's history list, in the same atomic step, by the
-- rules of HistoryLog::apply, so that a history needs nobody to watch.
-- The list holds one entry per lease, newest first; the newest
-- `history_length` are the history (it is trimmed to them once it holds
-- twice as many):
--   FENCE MODE GRANTED_MS EXPIRES_MS[ HOW AT_MS[ BY]]\nOWNER\nMETA
-- MODE exclusive, shared, permit or attempt; GRANTED_MS and EXPIRES_MS
-- (the lease end by its last grant, renewal or extend) in Unix ms; HOW,
-- once it ended, released, abandoned, completed, broken or expired, at
-- AT_MS, BY the id of the key that broke it. A lease whose key just ran
-- out stays open here: its reader, which sees that its fence holds
-- nothing, says it expired at EXPIRES_MS.
-- The caller passes, after its own keys and arguments (the tail):
-- KEYS[#KEYS] the history list; ARGV[#ARGV - 2] its length ('0': no
-- history), ARGV[#ARGV - 1] how long it outlives a lease's end, in ms
-- (the fence retention), ARGV[#ARGV] now, in the caller's Unix ms.
-- The list is kept the fence retention past the end of its last lease
-- (history_keep_until), as the fence counter is past the last grant.
-- Every history write is a pcall: a key of another type (a foreign
-- client's) loses the history, never the change.
local history_key = KEYS[#KEYS]
local history_length = tonumber(ARGV[#ARGV - 2]) or 0
local history_keep = tonumber(ARGV[#ARGV - 1]) or 0
local history_now = ARGV[#ARGV]
-- The MODE of a lease an `acquired` message grants: set by the script
-- (a semaphore's 'permit', a run's 'attempt').
local history_mode = 'exclusive'

local function history_ms(n)
  return string.format('%.0f', n)
end

-- An entry's parts when it is still open: its header up to its lease end,
-- that end, and the rest of its text; nil when it ended.
local function history_parts(item)
  local header = string.match(item, '^[^\n]*')
  local head, expires = string.match(header, '^(%d+ %a+ %d+) (%d+)$')
  if head then
    return head, expires, string.sub(item, #header + 1)
  end
  return nil
end

-- The entry of `fence` that is still open: its index, its header up to
-- its lease end, that end, the rest of its text, and the latest lease end
-- of the other open entries (0 when none). An exclusive lease (or a run's
-- attempt) is the newest entry and alone: it is found with one LINDEX, and
-- no other entry is open but for leases that ran out (so 0). A shared
-- lease or a permit may be further down, beside others still held.
local function history_open(fence)
  local prefix = fence .. ' '
  local newest = redis.pcall('LINDEX', history_key, 0)
  if type(newest) == 'string' and string.sub(newest, 1, #prefix) == prefix then
    local head, expires, body = history_parts(newest)
    local mode = head and string.match(head, '^%d+ (%a+)')
    if mode == 'exclusive' or mode == 'attempt' then
      return 0, head, expires, body, 0
    end
  end
  local items = redis.pcall('LRANGE', history_key, 0, history_length - 1)
  if type(items) ~= 'table' or items.err then
    return nil
  end
  local found, latest = nil, 0
  for i, item in ipairs(items) do
    local head, expires, body = history_parts(item)
    if head and string.sub(item, 1, #prefix) == prefix then
      found = {i - 1, head, expires, body}
    elseif head and tonumber(expires) > latest then
      latest = tonumber(expires)
    end
  end
  if not found then
    return nil
  end
  return found[1], found[2], found[3], found[4], latest
end

-- Keeps the list until `keep_ms` past `ends` (Unix ms), and never less
-- than the fence retention past now; a lease of a mode that is alone
-- (exclusive, attempt) sets it, a shared lease or a permit only lengthens
-- it (the others' leases may last longer).
local function history_keep_until(ends, mode)
  local ms = math.max(tonumber(ends) - tonumber(history_now), 0) + history_keep
  if mode == 'shared' or mode == 'permit' then
    local left = redis.pcall('PTTL', history_key)
    if type(left) == 'number' and left >= ms then
      return
    end
  end
  redis.pcall('PEXPIRE', history_key, history_ms(ms))
end

-- Ends the open entry of `fence` as `how`, at `at` (Unix ms), by `by`,
-- and keeps the list the fence retention past the last lease still open.
local function history_end(fence, how, at, by)
  local index, head, expires, body, latest = history_open(fence)
  if not index then
    return
  end
  if how == 'expired' and tonumber(expires) < tonumber(at) then
    at = expires
  end
  local tail = ''
  if by and by ~= '' then
    tail = ' ' .. by
  end
  redis.pcall('LSET', history_key, index,
    head .. ' ' .. expires .. ' ' .. how .. ' ' .. at .. tail .. body)
  redis.pcall('PEXPIRE', history_key, history_ms(math.max(latest - tonumber(history_now), 0) + history_keep))
end

-- Folds one change message into the history.
local function history_note(message)
  if history_length <= 0 then
    return
  end
  local kind, rest = string.match(message, '^(%a+) (.*)$')
  if kind == 'acquired' or kind == 'shared' then
    local fence, ttl, granted, tail = string.match(rest, '^(%d+) (%d+) (%d+) (.*)$')
    if not fence then
      return
    end
    local owner, meta = tail, ''
    local newline = string.find(tail, '\n', 1, true)
    if newline then
      owner, meta = string.sub(tail, 1, newline - 1), string.sub(tail, newline + 1)
    end
    local mode = history_mode
    if kind == 'shared' then
      mode = 'shared'
    end
    local entry = fence .. ' ' .. mode .. ' ' .. granted .. ' '
      .. history_ms(tonumber(granted) + tonumber(ttl)) .. '\n' .. owner .. '\n' .. meta
    -- Trimmed back to history_length once it holds twice that: one LTRIM
    -- every history_length grants rather than one each (readers read the
    -- newest history_length alone).
    local held = redis.pcall('LPUSH', history_key, entry)
    if type(held) == 'number' and held > 2 * history_length then
      redis.pcall('LTRIM', history_key, 0, history_length - 1)
    end
    history_keep_until(tonumber(granted) + tonumber(ttl), mode)
  elseif kind == 'extended' then
    local fence, ttl, at = string.match(rest, '^(%d+) (%d+) (%d+)$')
    if not fence then
      return
    end
    local index, head, _, body = history_open(fence)
    if index then
      local ends = tonumber(at) + tonumber(ttl)
      redis.pcall('LSET', history_key, index, head .. ' ' .. history_ms(ends) .. body)
      history_keep_until(ends, string.match(head, '^%d+ (%a+)'))
    end
  elseif kind == 'released' then
    local how = 'released'
    if history_mode == 'attempt' then
      how = 'abandoned'
    end
    history_end(rest, how, history_now)
  elseif kind == 'completed' then
    history_end(rest, 'completed', history_now)
  elseif kind == 'broken' then
    local fence, by = string.match(rest, '^(%d+) ?(.*)$')
    if fence then
      history_end(fence, 'broken', history_now, by)
    end
  elseif kind == 'expired' then
    history_end(rest, 'expired', history_now)
  end
end

-- Publishes `message` on `channel` with `publish` (PUBLISH, or SPUBLISH
-- on a Redis Cluster) and folds it into the history. pcall: a server
-- without SPUBLISH (Redis 6) still makes the change.
local function tell(publish, channel, message)
  redis.pcall(publish, channel, message)
  history_note(message)
end

-- Renames the open entry of fence `old` to `new`: Redlock raised the
-- fence of a grant whose nodes disagreed (raise_fence.lua).
local function history_refence(old, new)
  if history_length <= 0 then
    return
  end
  local index, head, expires, body = history_open(old)
  if index then
    local rest = string.match(head, '^%d+( .*)$')
    redis.pcall('LSET', history_key, index, new .. rest .. ' ' .. expires .. body)
  end
end
