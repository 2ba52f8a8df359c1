-- The change messages folded into the history (src/lock/history.rs), put
-- after history.lua in front of the scripts that publish their changes as
-- messages alone (the semaphores', the shared leases'): `tell` publishes
-- a message and folds it by the rules of HistoryLog::apply. The exclusive
-- lock's scripts and the runs' write an exclusive lease's or an attempt's
-- entry at its end from its record (history_closed, history_expired)
-- instead; the lock's have this only on their shared-lease paths.
-- The entries written at a grant and rewritten in place (a shared
-- lease's, a permit's; see history.lua).

-- An entry's parts when it is still open: its header up to its lease end,
-- that end, and the rest of its text; nil when it ended.
local function history_parts(item)
  return string.match(item, '^(%d+ %a+ %d+) (%d+)(\n.*)$')
end

-- The entry of `fence` that is still open: its index, its header up to
-- its lease end, that end, the rest of its text, and the latest lease end
-- of the other open entries (0 when none). A shared lease that the caller
-- knows is `alone` (no other is held) is found with one LINDEX when it is
-- the newest (no other entry is open then but for leases that ran out, so
-- 0). A shared lease or a permit may else be further down, beside others
-- still held.
local function history_open(fence, alone)
  local prefix = fence .. ' '
  local newest = redis.pcall('LINDEX', history_key, '0')
  if type(newest) == 'string' and string.sub(newest, 1, #prefix) == prefix then
    local head, expires, body = history_parts(newest)
    if head and alone then
      return 0, head, expires, body, 0
    end
  end
  local items = redis.pcall('LRANGE', history_key, '0', int(history_size() - 1))
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

-- Keeps the list until the fence retention past `ends` (Unix ms), and
-- never less than the retention past now; a lease that the caller knows
-- is `alone` sets it, others only lengthen it (the others' leases may
-- last longer).
local function history_keep_until(ends, alone)
  if not alone then
    local ms = math.max(ends - history_now, 0) + (tonumber(ARGV[#ARGV - 1]) or 0)
    local left = redis.pcall('PTTL', history_key)
    if type(left) == 'number' and left >= ms then
      return
    end
  end
  history_keep_for(ends - history_now)
end

-- A lease granted: its entry, newest first. `fence`, `granted` (Unix ms)
-- and `ttl` (ms) as decimal strings, `owner` and `meta` ('' when none);
-- `alone` when the caller knows no other lease of the name is held.
local function history_granted(fence, mode, granted, ttl, owner, meta, alone)
  if not history_on then
    return
  end
  local ends = granted + ttl
  -- Trimmed back to the length once it holds twice that: one LTRIM every
  -- length grants rather than one each (readers read the newest alone).
  local held = redis.pcall('LPUSH', history_key,
    fence .. ' ' .. mode .. ' ' .. granted .. ' ' .. int(ends) .. '\n' .. owner .. '\n' .. meta)
  if type(held) == 'number' and held > 2 and held > 2 * history_size() then
    redis.pcall('LTRIM', history_key, '0', int(history_size() - 1))
  end
  history_keep_until(ends, alone)
end

-- A lease renewed or extended at `at` (Unix ms) for `ttl` ms: its entry's
-- lease end moves.
local function history_extended(fence, ttl, at)
  if not history_on then
    return
  end
  local index, head, _, body = history_open(fence)
  if index then
    local ends = at + ttl
    redis.pcall('LSET', history_key, int(index), head .. ' ' .. int(ends) .. body)
    history_keep_until(ends)
  end
end

-- Ends the open entry of `fence` as `how`, now, by `by` (a key id, or
-- nil), and keeps the list the fence retention past the last lease still
-- open; `alone` when the caller knows no other lease of the name is held.
local function history_ended(fence, how, by, alone)
  if not history_on then
    return
  end
  local index, head, expires, body, latest = history_open(fence, alone)
  if not index then
    return
  end
  local at = history_now
  if how == 'expired' and tonumber(expires) < tonumber(at) then
    at = expires
  end
  local tail = ''
  if by and by ~= '' then
    tail = ' ' .. by
  end
  redis.pcall('LSET', history_key, int(index),
    head .. ' ' .. expires .. ' ' .. how .. ' ' .. at .. tail .. body)
  if latest > 0 then
    history_keep_for(latest - history_now)
  else
    history_keep_for(0)
  end
end

-- Folds one change message into the history.
local function history_note(message)
  if not history_on then
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
    history_granted(fence, mode, granted, ttl, owner, meta)
  elseif kind == 'extended' then
    local fence, ttl, at = string.match(rest, '^(%d+) (%d+) (%d+)$')
    if fence then
      history_extended(fence, ttl, at)
    end
  elseif kind == 'released' then
    history_ended(rest, 'released')
  elseif kind == 'broken' then
    local fence, by = string.match(rest, '^(%d+) ?(.*)$')
    if fence then
      history_ended(fence, 'broken', by)
    end
  elseif kind == 'expired' then
    history_ended(rest, 'expired')
  end
end

-- Publishes `message` and folds it into the history (history_note).
local function tell(publish, channel, message)
  publish_change(publish, channel, message)
  history_note(message)
end
