-- The history of a name (src/lock/history.rs), put in front of every
-- script that publishes a change: history_granted, history_extended and
-- history_ended record a change in the name's history list, in the same
-- atomic step as the change, by the rules of HistoryLog::apply, so that a
-- history needs nobody to watch (tell.lua folds a change message into it).
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
-- The length as given ('0': no history): read as a number only where a
-- number is needed (history_size), since each conversion costs Redis more
-- than a command does (docs/performance.md).
local history_on = ARGV[#ARGV - 2] ~= '0' and ARGV[#ARGV - 2] ~= ''
local history_now = ARGV[#ARGV]
-- The MODE of a lease an `acquired` message grants: set by the script
-- (a semaphore's 'permit', a run's 'attempt').
local history_mode = 'exclusive'

-- How many entries the history keeps (0: none).
local function history_size()
  return tonumber(ARGV[#ARGV - 2]) or 0
end

-- A whole number of ms as Redis and the entries write it.
local function history_ms(n)
  return string.format('%d', n)
end

-- Keeps the list `ms` from now plus the fence retention (the retention
-- alone, as given, when `ms` is not positive).
local function history_keep_for(ms)
  if ms <= 0 then
    redis.pcall('PEXPIRE', history_key, ARGV[#ARGV - 1])
  else
    redis.pcall('PEXPIRE', history_key, history_ms(ms + (tonumber(ARGV[#ARGV - 1]) or 0)))
  end
end

-- An entry's parts when it is still open: its header up to its lease end,
-- that end, and the rest of its text; nil when it ended.
local function history_parts(item)
  return string.match(item, '^(%d+ %a+ %d+) (%d+)(\n.*)$')
end

-- The entry of `fence` that is still open: its index, its header up to
-- its lease end, that end, the rest of its text, and the latest lease end
-- of the other open entries (0 when none). An exclusive lease (or a run's
-- attempt) is the newest entry and alone: it is found with one LINDEX, and
-- no other entry is open but for leases that ran out (so 0); so is a
-- shared lease that the caller knows is `alone` (no other is held) when
-- it is the newest. A shared lease or a permit may else be further down,
-- beside others still held.
local function history_open(fence, alone)
  local prefix = fence .. ' '
  local newest = redis.pcall('LINDEX', history_key, 0)
  if type(newest) == 'string' and string.sub(newest, 1, #prefix) == prefix then
    local head, expires, body = history_parts(newest)
    -- The mode's first seven letters.
    local mode = head and string.sub(head, #prefix + 1, #prefix + 7)
    if mode == 'exclusi' or mode == 'attempt' or (head and alone) then
      return 0, head, expires, body, 0
    end
  end
  local items = redis.pcall('LRANGE', history_key, 0, history_size() - 1)
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
-- never less than the retention past now; a lease of a mode that is alone
-- (exclusive, attempt), or that the caller knows is `alone`, sets it, a
-- shared lease or a permit only lengthens it (the others' leases may last
-- longer).
local function history_keep_until(ends, mode, alone)
  if not alone and (mode == 'shared' or mode == 'permit') then
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
    fence .. ' ' .. mode .. ' ' .. granted .. ' ' .. history_ms(ends) .. '\n' .. owner .. '\n' .. meta)
  if type(held) == 'number' and held > 2 and held > 2 * history_size() then
    redis.pcall('LTRIM', history_key, 0, history_size() - 1)
  end
  history_keep_until(ends, mode, alone)
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
    redis.pcall('LSET', history_key, index, head .. ' ' .. history_ms(ends) .. body)
    history_keep_until(ends, string.match(head, '^%d+ (%a+)'))
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
  redis.pcall('LSET', history_key, index,
    head .. ' ' .. expires .. ' ' .. how .. ' ' .. at .. tail .. body)
  if latest > 0 then
    history_keep_for(latest - history_now)
  else
    history_keep_for(0)
  end
end

-- Publishes `message` on `channel` with `publish` (PUBLISH, or SPUBLISH
-- on a Redis Cluster). pcall: a server without SPUBLISH (Redis 6) still
-- makes the change. A script that has the change's fields at hand
-- publishes with this and calls history_granted, history_extended or
-- history_ended itself, rather than have `tell` parse the message.
local function publish_change(publish, channel, message)
  redis.pcall(publish, channel, message)
end
