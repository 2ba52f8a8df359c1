-- The change messages folded into the history (src/lock/history.rs), put
-- after history.lua in front of the scripts that publish their changes as
-- messages alone (the semaphores', the runs', the shared leases'): `tell`
-- publishes a message and folds it by the rules of HistoryLog::apply. The
-- exclusive lock's scripts call history_granted, history_extended and
-- history_ended with the fields at hand instead, and have this only on
-- their shared-lease paths.
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
    local how = 'released'
    if history_mode == 'attempt' then
      how = 'abandoned'
    end
    history_ended(rest, how)
  elseif kind == 'completed' then
    history_ended(rest, 'completed')
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
