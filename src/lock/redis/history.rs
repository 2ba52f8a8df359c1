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

/// A read of a history: the inspect script `inspect` (after `prefix`, the
/// Lua it needs, `history.lua` included) wrapped in a function, then
/// `last` appended to its answer, in one atomic step: a Lua expression of
/// `kept`, the newest entries of the history list (the last key; as many
/// as `history.lua`'s `history_size()`, from the tail of the arguments).
pub(super) fn read_script(prefix: &str, inspect: &str, last: &str) -> Script {
    Script::new(&format!(
        "{prefix}local function read_now()\n{inspect}\nend\n\
         local read = read_now()\n\
         if read.err then return read end\n\
         local kept = redis.pcall('LRANGE', KEYS[#KEYS], 0, history_size() - 1)\n\
         if type(kept) ~= 'table' or kept.err then kept = {{}} end\n\
         read[#read + 1] = {last}\n\
         return read\n"
    ))
}

/// A lock's history: its holder as `inspect.lua` reads it, then `{kept,
/// record}`: the list, and the entry its holder hash keeps (see
/// `history.lua`: an exclusive lease's entry is written to the list at its
/// end), `{}` when the history is off.
static LOCK_HISTORY: LazyLock<Script> = LazyLock::new(|| {
    read_script(
        &SHARED_LUA,
        INSPECT_LUA,
        "{kept, history_on and history_record(KEYS[2]) or {}}",
    )
});

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

    /// How long an exclusive lease's holder hash is kept, in ms, for a
    /// lease of `ttl_ms`: the lease, and while the history is on, the
    /// fence retention after it, so that a lease that ran out is still in
    /// the history (`history.lua`'s `holder_keep_ms`).
    pub(super) fn holder_keep_ms(&self, ttl_ms: u64) -> u64 {
        if self.history_length.is_off() {
            ttl_ms
        } else {
            ttl_ms.saturating_add(self.fence_retention_ms)
        }
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
        let (answer, (kept, record)) =
            inspect_and::<(Vec<String>, Vec<Option<String>>)>(self.run(&call).await?);
        let live = holder_of(answer, read_at)
            .map(|(_, info)| info.fences())
            .unwrap_or_default();
        Ok(self.settle_history(&kept, &record, Some(Mode::Exclusive), &live))
    }

    /// A history as read: the list `kept`, and the `record` of a lease of
    /// `mode` whose entry is written at its end (an exclusive lease's
    /// holder hash, a run's record: see [`held_entry`]; empty when there
    /// is none), newest first, one entry per fence, at most
    /// `--history-length`, settled against the `live` fences (see
    /// [`history::settle`]). The record's entry is left out once its lease
    /// ended more than the fence retention ago (a run's record may be kept
    /// longer, for its own retention). Entries lockd did not write are
    /// dropped.
    pub(super) fn settle_history(
        &self,
        kept: &[String],
        record: &[Option<String>],
        mode: Option<Mode>,
        live: &[u64],
    ) -> Vec<HistoryEntry> {
        let now = SystemTime::now();
        let retention = std::time::Duration::from_millis(self.fence_retention_ms);
        let mut entries: Vec<HistoryEntry> = kept.iter().filter_map(|e| parse_entry(e)).collect();
        entries.extend(held_entry(record, mode).filter(|e| e.expires_at + retention > now));
        history::settle(
            newest_per_fence(entries, self.history_length.get()),
            live,
            now,
        )
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

/// The open entry of a lease of `mode` (`None`: a run's attempt) that an
/// `HMGET` of its record reads (an exclusive lease's holder hash, as
/// `history.lua`'s `history_record` reads it: fence, granted_at_ms,
/// ends_ms, owner, meta; a run's record: fence, started_at_ms, ends_ms,
/// owner, meta); `None` when a field it needs is missing (no record, or
/// one an earlier lockd wrote, whose entry is in the list).
fn held_entry(record: &[Option<String>], mode: Option<Mode>) -> Option<HistoryEntry> {
    let field = |i: usize| record.get(i).cloned().flatten();
    let number = |i: usize| field(i)?.parse::<u64>().ok();
    Some(HistoryEntry {
        fence: number(0)?,
        mode,
        granted_at: from_unix_ms(number(1)?),
        expires_at: from_unix_ms(number(2)?),
        owner: field(3).filter(|o| !o.is_empty()),
        meta: field(4).as_deref().and_then(Meta::from_stored),
        ended: None,
    })
}

/// `entries` newest first (by fence: a fence grows with every grant of a
/// name, and an exclusive lease's entry is pushed at its end, a shared
/// lease's at its grant), one per fence (an ended one before an open one:
/// an earlier lockd wrote the entry at the grant), at most `length`.
fn newest_per_fence(mut entries: Vec<HistoryEntry>, length: usize) -> Vec<HistoryEntry> {
    entries.sort_by(|a, b| {
        b.fence
            .cmp(&a.fence)
            .then_with(|| b.ended.is_some().cmp(&a.ended.is_some()))
    });
    entries.dedup_by_key(|e| e.fence);
    entries.truncate(length);
    entries
}

/// The history list, the last value of a read script's answer.
///
/// # Errors
/// [`LockError::Backend`] when it is not a list of texts.
pub(super) fn kept_of(answer: &mut Vec<Value>) -> Result<Vec<String>, LockError> {
    last_of(answer)
}

/// The last value of a read script's answer (what [`read_script`]'s `last`
/// appended), as a `T`.
///
/// # Errors
/// [`LockError::Backend`] when it is missing or not a `T`.
pub(super) fn last_of<T: redis::FromRedisValue>(answer: &mut Vec<Value>) -> Result<T, LockError> {
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

    #[test]
    fn a_holder_hash_reads_as_its_open_entry() {
        let some = |s: &str| Some(s.to_owned());
        let held = held_entry(
            &[some("9"), some("1000"), some("2500"), some("w"), some("")],
            Some(Mode::Exclusive),
        )
        .expect("complete");
        assert_eq!(
            (held.fence, held.mode, held.owner.as_deref(), held.meta),
            (9, Some(Mode::Exclusive), Some("w"), None)
        );
        assert_eq!(
            (held.granted_at, held.expires_at),
            (from_unix_ms(1000), from_unix_ms(2500))
        );
        assert!(held.ended.is_none());
        // An earlier lockd's hash (no `ends_ms`), none, or not numbers.
        for bad in [
            vec![some("9"), some("1000"), None, some("w"), None],
            vec![],
            vec![some("x"), some("1000"), some("2500"), None, None],
        ] {
            assert_eq!(held_entry(&bad, Some(Mode::Exclusive)), None, "{bad:?}");
        }
    }

    #[test]
    fn entries_are_newest_fence_first_one_each_ended_before_open() {
        let entry = |text: &str| parse_entry(text).expect("valid");
        let entries = vec![
            entry("5 exclusive 10 20 released 15\n\n"),
            entry("7 shared 30 40\n\n"),
            entry("6 exclusive 20 30\n\n"),
            entry("6 exclusive 20 30 released 25\n\n"),
            entry("8 exclusive 40 50\n\n"),
        ];
        let kept = newest_per_fence(entries, 3);
        let fences: Vec<u64> = kept.iter().map(|e| e.fence).collect();
        assert_eq!(fences, [8, 7, 6]);
        assert!(kept[2].ended.is_some(), "the ended entry of fence 6 wins");
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
