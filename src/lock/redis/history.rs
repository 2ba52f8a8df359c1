//! Histories and breaks on the Redis backend: `scripts/history.lua`, the
//! fold that every script which publishes a change runs on its message,
//! and what reads a history back (an inspect and the list, in one step)
//! or breaks leases. A name's history is a list under the name's hash
//! tag (`P{N}:history`, `Psem:{N}:history`, `Prun:{K}:history`), its
//! entries as `history.lua`'s header says, kept for the fence retention
//! past a lease's last known end.
//!
//! This file has the parts every kind shares and the lock's; the
//! semaphore's and the run's are beside their other scripts
//! (`semaphores.rs`, `runs.rs`).

use std::sync::LazyLock;
use std::time::SystemTime;

use redis::{Script, ScriptInvocation, Value};
use tokio::time::Instant;

use super::{INSPECT_LUA, Keys, RedisBackend, SHARED_LUA, holder_of, inspect_and};
use crate::lock::history::{self, BrokenLease, Ended, Ending, HistoryEntry, from_unix_ms};
use crate::lock::{LockError, LockName, Meta, Mode, unix_millis};

/// The history's Lua (`tell`, `history_note`, ...): put in front of every
/// script that publishes a change.
pub(super) const HISTORY_LUA: &str = include_str!("scripts/history.lua");

/// `tell` (`scripts/tell.lua`): a change message published and folded
/// into the history; put after [`HISTORY_LUA`] in front of the scripts
/// that publish their changes as messages alone.
pub(super) const TELL_LUA: &str = include_str!("scripts/tell.lua");

/// A read of a history: the inspect script `inspect` (after `prefix`, the
/// Lua it needs, `history.lua` included) wrapped in a function, then the newest entries of the
/// history list (the last key; as many as `history.lua`'s
/// `history_size()`, from the tail of the arguments) appended to its
/// answer, in one atomic step.
pub(super) fn read_script(prefix: &str, inspect: &str) -> Script {
    Script::new(&format!(
        "{prefix}local function read_now()\n{inspect}\nend\n\
         local read = read_now()\n\
         if read.err then return read end\n\
         local kept = redis.pcall('LRANGE', KEYS[#KEYS], 0, history_size() - 1)\n\
         if type(kept) ~= 'table' or kept.err then kept = {{}} end\n\
         read[#read + 1] = kept\n\
         return read\n"
    ))
}

/// A lock's history: its holder as `inspect.lua` reads it, then the list.
static LOCK_HISTORY: LazyLock<Script> = LazyLock::new(|| read_script(&SHARED_LUA, INSPECT_LUA));

/// A lock's break (`break.lua`).
static LOCK_BREAK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{}{}",
        *SHARED_LUA,
        include_str!("scripts/break.lua")
    ))
});

impl RedisBackend {
    /// Appends the history tail `history.lua` reads to `call`: the list's
    /// key (`history`), its length, how long it outlives a lease's end
    /// (the fence retention), and now in Unix ms.
    pub(super) fn with_history(&self, call: &mut ScriptInvocation<'_>, history: &str) {
        call.key(history)
            .arg(self.history_length.get())
            .arg(self.fence_retention_ms)
            .arg(unix_millis(SystemTime::now()));
    }

    /// The history of lock `name` (see [`crate::lock::Node::history`]).
    ///
    /// # Errors
    /// As for [`crate::lock::LockNode::acquire`].
    pub(super) async fn lock_history(
        &self,
        name: &LockName,
    ) -> Result<Vec<HistoryEntry>, LockError> {
        let keys = Keys::new(&self.prefix, name);
        let mut call = LOCK_HISTORY.prepare_invoke();
        call.key(&keys.lock)
            .key(&keys.meta)
            .key(&keys.fence)
            .key(&keys.shared)
            .key(&keys.readers)
            .key(&keys.writers);
        self.with_history(&mut call, &keys.history);
        let read_at = Instant::now();
        let (answer, kept) = inspect_and::<Vec<String>>(self.run(&call).await?);
        let live = holder_of(answer, read_at)
            .map(|(_, info)| info.fences())
            .unwrap_or_default();
        Ok(settled(&kept, &live))
    }

    /// Breaks the live lease (or shared leases) of lock `name` (see
    /// [`crate::lock::Node::break_leases`]).
    ///
    /// # Errors
    /// As for [`crate::lock::LockNode::acquire`].
    pub(super) async fn break_lock(
        &self,
        name: &LockName,
        fence: Option<u64>,
        by: &str,
    ) -> Result<Vec<BrokenLease>, LockError> {
        let keys = Keys::new(&self.prefix, name);
        let mut call = LOCK_BREAK.prepare_invoke();
        call.key(&keys.lock)
            .key(&keys.meta)
            .key(&keys.shared)
            .key(&keys.readers)
            .key(&keys.writers)
            .arg(fence.map(|f| f.to_string()).unwrap_or_default())
            .arg(by)
            .arg(&keys.released)
            .arg(self.events.publish());
        self.with_history(&mut call, &keys.history);
        let answer: Vec<String> = self.run(&call).await?;
        Ok(broken_of(&answer))
    }
}

/// The history list `kept` as read, settled against the `live` fences
/// (see [`history::settle`]); entries lockd did not write are dropped.
pub(super) fn settled(kept: &[String], live: &[u64]) -> Vec<HistoryEntry> {
    let entries = kept.iter().filter_map(|e| parse_entry(e)).collect();
    history::settle(entries, live, SystemTime::now())
}

/// The history list, the last value of a read script's answer.
///
/// # Errors
/// [`LockError::Backend`] when it is not a list of texts.
pub(super) fn kept_of(answer: &mut Vec<Value>) -> Result<Vec<String>, LockError> {
    let last = answer
        .pop()
        .ok_or_else(|| LockError::Backend("a history read answered nothing".into()))?;
    redis::from_redis_value(last)
        .map_err(|e| LockError::Backend(format!("a history read answered {e}")))
}

/// The leases a break script says it ended: `{fence, mode, owner, meta,
/// ...}`.
pub(super) fn broken_of(answer: &[String]) -> Vec<BrokenLease> {
    answer
        .chunks_exact(4)
        .map(|f| BrokenLease {
            fence: f[0].parse().unwrap_or(0),
            mode: mode_of(&f[1]),
            owner: Some(f[2].clone()).filter(|o| !o.is_empty()),
            meta: Meta::from_stored(&f[3]),
        })
        .collect()
}

/// A lease's mode as an entry names it: a lock's, or `None` for a permit
/// or an attempt.
fn mode_of(word: &str) -> Option<Mode> {
    match word {
        "exclusive" => Some(Mode::Exclusive),
        "shared" => Some(Mode::Shared),
        _ => None,
    }
}

/// One entry of a history list, as `history.lua` writes it:
/// `FENCE MODE GRANTED_MS EXPIRES_MS[ HOW AT_MS[ BY]]\nOWNER\nMETA`;
/// `None` for anything else (a foreign client's).
pub(super) fn parse_entry(text: &str) -> Option<HistoryEntry> {
    let mut lines = text.splitn(3, '\n');
    let header = lines.next()?;
    let owner = lines.next()?;
    let meta = lines.next().unwrap_or("");
    let mut fields = header.split(' ');
    let fence = fields.next()?.parse().ok()?;
    let mode = fields.next()?;
    let granted_at = from_unix_ms(fields.next()?.parse().ok()?);
    let expires_at = from_unix_ms(fields.next()?.parse().ok()?);
    let ended = match fields.next() {
        None => None,
        Some(how) => Some(Ended {
            how: Ending::parse(how)?,
            at: from_unix_ms(fields.next()?.parse().ok()?),
            by: fields.next().filter(|b| !b.is_empty()).map(str::to_owned),
        }),
    };
    if fields.next().is_some() {
        return None;
    }
    Some(HistoryEntry {
        fence,
        mode: mode_of(mode),
        owner: Some(owner).filter(|o| !o.is_empty()).map(str::to_owned),
        meta: Meta::from_stored(meta),
        granted_at,
        expires_at,
        ended,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn entries_parse_as_history_lua_writes_them() {
        let open = parse_entry("17 shared 1000 2500\nweb 1\n{\"pid\":4}").expect("valid");
        assert_eq!(open.fence, 17);
        assert_eq!(open.mode, Some(Mode::Shared));
        assert_eq!(open.owner.as_deref(), Some("web 1"));
        assert_eq!(open.meta.as_ref().map(Meta::as_str), Some("{\"pid\":4}"));
        assert_eq!(open.expires_at, from_unix_ms(2500));
        assert!(open.ended.is_none());
        let broken = parse_entry("18 permit 1000 2500 broken 1200 ops\n\n").expect("valid");
        assert_eq!(broken.mode, None);
        assert_eq!(broken.owner, None);
        let end = broken.ended.expect("ended");
        assert_eq!(
            (end.how, end.at, end.by.as_deref()),
            (Ending::Broken, from_unix_ms(1200), Some("ops"))
        );
        for bad in [
            "",
            "x",
            "1 exclusive 1",
            "1 exclusive 1 2",
            "1 exclusive 1 2 gone 3\n\n",
        ] {
            assert_eq!(parse_entry(bad), None, "{bad:?}");
        }
    }

    proptest! {
        /// Whatever the owner (no control character) and the metadata
        /// (compact JSON), an entry reads back as it was written.
        #[test]
        fn any_entry_reads_back(
            fence in 1..(1u64 << 53),
            granted in 0..(1u64 << 42),
            ttl in 1..(1u64 << 35),
            owner in "[^\\x00-\\x1f]{0,40}",
            meta in proptest::option::of("[^\\x00-\\x1f]{0,40}"),
            end in proptest::option::of((0..5usize, 0..(1u64 << 42), "[A-Za-z0-9_.-]{0,12}")),
        ) {
            let meta = meta.and_then(|m| Meta::parse(&serde_json::json!({ "m": m }), 1024).ok());
            let ends = [Ending::Released, Ending::Expired, Ending::Broken, Ending::Abandoned, Ending::Completed];
            let mut text = format!("{fence} exclusive {granted} {}", granted + ttl);
            let ended = end.map(|(how, at, by)| {
                text.push_str(&format!(" {} {at}", ends[how].as_str()));
                if !by.is_empty() {
                    text.push_str(&format!(" {by}"));
                }
                Ended { how: ends[how], at: from_unix_ms(at), by: Some(by).filter(|b| !b.is_empty()) }
            });
            text.push_str(&format!("\n{owner}\n{}", meta.as_ref().map_or("", Meta::as_str)));
            let read = parse_entry(&text).expect("reads back");
            prop_assert_eq!(read, HistoryEntry {
                fence,
                mode: Some(Mode::Exclusive),
                owner: Some(owner).filter(|o| !o.is_empty()),
                meta,
                granted_at: from_unix_ms(granted),
                expires_at: from_unix_ms(granted + ttl),
                ended,
            });
        }
    }
}
