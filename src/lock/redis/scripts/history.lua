-- The history of a name (src/lock/history.rs), put in front of every
-- script that publishes a change: history_closed here (and
-- history_granted, history_extended and history_ended in tell.lua) record
-- a change in the name's history list, in the same atomic step as the
-- change, by the rules of HistoryLog::apply, so that a history needs
-- nobody to watch (tell.lua folds a change message into it).
-- The list holds one entry per lease, newest first; the newest
-- `history_length` are the history (it is trimmed to them once it holds
-- twice as many). A shared lease or a permit has its entry from its
-- grant on; an exclusive lease or a run's attempt has its entry from its
-- end on (history_closed), and until then its record is the holder hash
-- (kept the fence retention past the lease's end while the history is
-- on) or the run's record (run.lua), so that a lease that ran out is
-- still read, and is written to the list by the next grant
-- (history_lapsed, history_expired): one write a lease, not two
-- (docs/performance.md). Entries:
--   FENCE MODE GRANTED_MS EXPIRES_MS[ HOW AT_MS[ BY]]\nOWNER\nMETA
-- MODE exclusive, shared, permit or attempt; GRANTED_MS and EXPIRES_MS
-- (the lease end by its last grant, renewal or extend) in Unix ms; HOW,
-- once it ended, released, abandoned, completed, broken or expired, at
-- AT_MS, BY the id of the key that broke it. A lease whose key just ran
-- out stays open here: its reader, which sees that its fence holds
-- nothing, says it expired at EXPIRES_MS.
-- The functions that write an open entry and rewrite it (history_granted,
-- history_extended, history_ended) are in tell.lua, defined only in the
-- scripts that may need them: each Lua function is made anew at every
-- call of a script.
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
-- The MODE of a lease an `acquired` message grants (tell.lua): set by
-- the script (a semaphore's 'permit').
local history_mode = 'exclusive'

-- How many entries the history keeps (0: none).
local function history_size()
  return tonumber(ARGV[#ARGV - 2]) or 0
end

-- A whole number `n` (ms, µs, an index) as decimal text, as Redis and the
-- history's entries write it; for every script, which all have this file
-- in front. A Lua number given to redis.call is written with a "%.17g"
-- printf (and one joined to text with "%.14g", which rounds a time in µs
-- to its 14 first digits): each costs Redis several times what this does
-- (docs/performance.md).
local function int(n)
  return string.format('%d', n)
end

-- Keeps the list `ms` from now plus the fence retention (the retention
-- alone, as given, when `ms` is not positive).
local function history_keep_for(ms)
  if ms <= 0 then
    redis.pcall('PEXPIRE', history_key, ARGV[#ARGV - 1])
  else
    redis.pcall('PEXPIRE', history_key, int(ms + (tonumber(ARGV[#ARGV - 1]) or 0)))
  end
end

-- Adds an ended entry, newest first, and keeps the list the fence
-- retention from now: the whole entry of a lease of `mode` ('exclusive',
-- or a run's 'attempt'), written once at its end. `fence`, `granted` and
-- `ends` (Unix ms) as decimal strings (`ends` false when not recorded:
-- `at` stands for it), `owner` and `meta` (false or '' when none), `how`
-- it ended, `at` (Unix ms), `by` (a key id, or nil). Nothing without a
-- fence and a grant time (a foreign client's key).
local function history_closed(fence, mode, granted, ends, owner, meta, how, at, by)
  if not history_on or not fence or not granted then
    return
  end
  local tail = ''
  if by and by ~= '' then
    tail = ' ' .. by
  end
  local held = redis.pcall('LPUSH', history_key, fence .. ' ' .. mode .. ' ' .. granted .. ' '
    .. (ends or at) .. ' ' .. how .. ' ' .. at .. tail .. '\n' .. (owner or '') .. '\n' .. (meta or ''))
  if type(held) == 'number' and held > 2 and held > 2 * history_size() then
    redis.pcall('LTRIM', history_key, '0', int(history_size() - 1))
  end
  history_keep_for(0)
end

-- The fields of the entry that the holder hash `meta_key` of an exclusive
-- lease keeps: {fence, granted_at_ms, ends_ms, owner, meta}, false where
-- missing; {} when it is not a hash (a foreign client's key).
local function history_record(meta_key)
  local r = redis.pcall('HMGET', meta_key, 'fence', 'granted_at_ms', 'ends_ms', 'owner', 'meta')
  if type(r) ~= 'table' or r.err then
    return {}
  end
  return r
end

-- The entry of a lease of `mode` whose record `r` ({fence, granted_at_ms,
-- ends_ms, owner, meta}, as history_record reads it) stayed after its
-- key went (the history is on): ended as expired at its lease end (now,
-- if that is still to come: the key was deleted by a foreign client).
-- Nothing when the record has no lease end (an earlier lockd's, whose
-- entry is in the list). Called by a grant before it writes the record
-- over.
local function history_expired(mode, r)
  if r[3] then
    local at = r[3]
    if tonumber(at) > tonumber(history_now) then
      at = history_now
    end
    history_closed(r[1], mode, r[2], r[3], r[4], r[5], 'expired', at)
  end
end

-- The holder hash `meta_key` of an exclusive lease whose key is gone
-- while the hash stayed: its entry (history_expired).
local function history_lapsed(meta_key)
  if not history_on then
    return
  end
  history_expired('exclusive', history_record(meta_key))
end

-- How long the holder hash of an exclusive lease of `ttl` ms (a decimal
-- string) is kept: the lease, and while the history is on, the fence
-- retention after it (see history_closed).
local function holder_keep_ms(ttl)
  if not history_on then
    return ttl
  end
  return string.format('%d', tonumber(ttl) + (tonumber(ARGV[#ARGV - 1]) or 0))
end

-- Publishes `message` on `channel` with `publish` (PUBLISH, or SPUBLISH
-- on a Redis Cluster). pcall: a server without SPUBLISH (Redis 6) still
-- makes the change. A script that has the change's fields at hand
-- publishes with this and calls history_granted, history_extended or
-- history_ended itself, rather than have `tell` parse the message.
local function publish_change(publish, channel, message)
  redis.pcall(publish, channel, message)
end
