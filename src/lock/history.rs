//! The history of a name: its last grants and how each ended, newest
//! first, for `GET /locks/{name}/history` (and a semaphore's, a run's),
//! and what a break ends ([`BrokenLease`]).
//!
//! A history is a fold over the change messages a subject's changes
//! publish ([`Change`]): an `acquired` (or `shared`) message adds an entry
//! ([`HistoryLog::apply`]), an `extended` one moves its lease end, and
//! `released`, `completed` and `broken` end it; `expired` (a permit or a
//! shared lease a script found run out) ends it at its lease end. The
//! memory backend folds the [`Change`]s it tells; the Redis scripts fold
//! the messages they publish, in the same atomic step, with the same rules
//! (`redis/scripts/history.lua`), so a history needs nobody to watch.
//!
//! A lease whose key simply ran out (an exclusive lock's, a run attempt's)
//! has no message: its entry stays open. When the history is read, with
//! the fences that hold the subject at that moment, an open entry whose
//! fence holds nothing any more ended by expiring at its last known lease
//! end ([`settle`]).
//!
//! Times are the wall clock of the lockd that made each change (Unix ms),
//! as the change messages carry them.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use super::{Change, Kind, Meta, Mode};

/// How many entries a name's history keeps: `--history-length`, 0 (no
/// history) to [`HistoryLength::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLength(usize);

impl HistoryLength {
    /// The default: 20 entries per name.
    pub const DEFAULT: Self = Self(20);
    /// The most entries a name may keep: 1000.
    pub const MAX: usize = 1000;
    /// No history at all.
    pub const OFF: Self = Self(0);

    /// `entries`, when at most [`Self::MAX`].
    pub fn new(entries: usize) -> Option<Self> {
        (entries <= Self::MAX).then_some(Self(entries))
    }

    /// How many entries.
    pub fn get(self) -> usize {
        self.0
    }

    /// Whether no history is kept.
    pub fn is_off(self) -> bool {
        self.0 == 0
    }
}

impl Default for HistoryLength {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How a lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Its holder released it (a permit given back).
    Released,
    /// Its lease ran out.
    Expired,
    /// An admin broke it (`DELETE ...?force=true`).
    Broken,
    /// A run's attempt, abandoned by its holder: nothing was stored.
    Abandoned,
    /// A run's attempt that completed the run.
    Completed,
}

impl Ending {
    /// Its name in answers and in the stored history: `released`,
    /// `expired`, `broken`, `abandoned` or `completed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::Expired => "expired",
            Self::Broken => "broken",
            Self::Abandoned => "abandoned",
            Self::Completed => "completed",
        }
    }

    /// The ending named `word` (as [`Self::as_str`] writes it).
    pub fn parse(word: &str) -> Option<Self> {
        [
            Self::Released,
            Self::Expired,
            Self::Broken,
            Self::Abandoned,
            Self::Completed,
        ]
        .into_iter()
        .find(|e| e.as_str() == word)
    }
}

/// The end of a lease in a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// How it ended.
    pub how: Ending,
    /// When.
    pub at: SystemTime,
    /// For a break: the id of the API key that broke it (`dev` in
    /// `--dev` without keys).
    pub by: Option<String>,
}

/// One lease in a history: never its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// Its fencing token, which names it.
    pub fence: u64,
    /// A lock's lease: how it was held. `None` for a permit or a run's
    /// attempt.
    pub mode: Option<Mode>,
    /// The holder's label, when given.
    pub owner: Option<String>,
    /// The holder's metadata, when given (the last a renewal gave is not
    /// followed: the grant's).
    pub meta: Option<Meta>,
    /// When it was granted.
    pub granted_at: SystemTime,
    /// When its lease ends (or ended) by its last grant, renewal or
    /// extend.
    pub expires_at: SystemTime,
    /// How and when it ended; `None` while it holds.
    pub ended: Option<Ended>,
}

impl HistoryEntry {
    /// How long it was held: from its grant to its end, or to `now` while
    /// it holds.
    pub fn held_for(&self, now: SystemTime) -> Duration {
        let until = self.ended.as_ref().map_or(now, |e| e.at);
        until.duration_since(self.granted_at).unwrap_or_default()
    }
}

/// A lease a break ended: never its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenLease {
    /// Its fencing token.
    pub fence: u64,
    /// A lock's lease: how it was held; `None` for a permit or an attempt.
    pub mode: Option<Mode>,
    /// The holder's label, when given.
    pub owner: Option<String>,
    /// The holder's metadata, when given.
    pub meta: Option<Meta>,
}

/// A name's history as a backend keeps it in memory: the entries, newest
/// first, at most `length`.
#[derive(Debug, Clone, Default)]
pub struct HistoryLog {
    entries: VecDeque<HistoryEntry>,
}

impl HistoryLog {
    /// Folds one change of a subject of `kind` into the history, made at
    /// `now`, keeping at most `length` entries. A change about a lease the
    /// history no longer has (or never had) is dropped; so is a probe.
    pub fn apply(&mut self, kind: Kind, change: &Change, now: SystemTime, length: HistoryLength) {
        if length.is_off() {
            self.entries.clear();
            return;
        }
        match change {
            Change::Acquired {
                fence,
                ttl_ms,
                granted_at_ms,
                owner,
                meta,
                mode,
            } => {
                let granted_at = from_unix_ms(*granted_at_ms);
                self.entries.push_front(HistoryEntry {
                    fence: *fence,
                    mode: (kind == Kind::Lock).then_some(*mode),
                    owner: owner.clone(),
                    meta: meta.clone(),
                    granted_at,
                    expires_at: granted_at + Duration::from_millis(*ttl_ms),
                    ended: None,
                });
                self.entries.truncate(length.get());
            }
            Change::Extended {
                fence,
                ttl_ms,
                at_ms,
            } => {
                if let Some(entry) = self.open(*fence) {
                    let at = at_ms.map_or(now, from_unix_ms);
                    entry.expires_at = at + Duration::from_millis(*ttl_ms);
                }
            }
            Change::Released { fence } => {
                let how = if kind == Kind::Run {
                    Ending::Abandoned
                } else {
                    Ending::Released
                };
                self.end(*fence, how, now, None);
            }
            Change::Completed { fence } => self.end(*fence, Ending::Completed, now, None),
            Change::Broken { fence, by } => self.end(*fence, Ending::Broken, now, by.clone()),
            Change::Expired { fence } => {
                if let Some(entry) = self.open(*fence) {
                    let at = entry.expires_at.min(now);
                    entry.ended = Some(Ended {
                        how: Ending::Expired,
                        at,
                        by: None,
                    });
                }
            }
            Change::Probe(_) | Change::Unknown => {}
        }
    }

    /// Renames the open entry of fence `old` to `new`: Redlock raised the
    /// fence of a grant whose nodes disagreed.
    pub fn refence(&mut self, old: u64, new: u64) {
        if let Some(entry) = self.open(old) {
            entry.fence = new;
        }
    }

    /// The entries, newest first, as kept (open ones not yet settled).
    pub fn entries(&self) -> impl Iterator<Item = &HistoryEntry> {
        self.entries.iter()
    }

    /// The open entry of `fence`, if kept.
    fn open(&mut self, fence: u64) -> Option<&mut HistoryEntry> {
        self.entries
            .iter_mut()
            .find(|e| e.fence == fence && e.ended.is_none())
    }

    /// Ends the open entry of `fence` as `how`, at `at`.
    fn end(&mut self, fence: u64, how: Ending, at: SystemTime, by: Option<String>) {
        if let Some(entry) = self.open(fence) {
            entry.ended = Some(Ended { how, at, by });
        }
    }
}

/// A history as read: `entries` (newest first), with each open entry
/// whose fence is not among `live` (the fences that hold the subject when
/// it was read) ended as [`Ending::Expired`] at its lease end, or at `now`
/// if that is still to come (a lease lost with Redis's data, or deleted by
/// a foreign client, did not run its course).
pub fn settle(mut entries: Vec<HistoryEntry>, live: &[u64], now: SystemTime) -> Vec<HistoryEntry> {
    for entry in &mut entries {
        if entry.ended.is_none() && !live.contains(&entry.fence) {
            entry.ended = Some(Ended {
                how: Ending::Expired,
                at: entry.expires_at.min(now),
                by: None,
            });
        }
    }
    entries
}

/// The history of a lock kept on several independent nodes (Redlock),
/// from each node's settled history: one entry per fence, newest first, as
/// many as the longest node's. Where nodes disagree, an end a holder or an admin made
/// (released, broken) wins over a lease still open on some node, which
/// wins over an expiry a node inferred (it may have missed the release).
pub fn merge(per_node: Vec<Vec<HistoryEntry>>) -> Vec<HistoryEntry> {
    fn rank(entry: &HistoryEntry) -> u8 {
        match &entry.ended {
            Some(Ended {
                how: Ending::Expired,
                ..
            }) => 0,
            None => 1,
            Some(_) => 2,
        }
    }
    let length = per_node.iter().map(Vec::len).max().unwrap_or(0);
    let mut by_fence: std::collections::BTreeMap<u64, HistoryEntry> =
        std::collections::BTreeMap::new();
    for entry in per_node.into_iter().flatten() {
        match by_fence.get(&entry.fence) {
            Some(kept) if rank(kept) >= rank(&entry) => {}
            _ => {
                by_fence.insert(entry.fence, entry);
            }
        }
    }
    by_fence.into_values().rev().take(length).collect()
}

/// A time given in Unix milliseconds.
pub fn from_unix_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        from_unix_ms(ms)
    }

    fn acquired(fence: u64, ttl_ms: u64, granted_at_ms: u64) -> Change {
        Change::Acquired {
            fence,
            ttl_ms,
            granted_at_ms,
            owner: Some("w".into()),
            meta: None,
            mode: Mode::Exclusive,
        }
    }

    #[test]
    fn a_grant_then_a_release_is_one_released_entry() {
        let mut log = HistoryLog::default();
        let len = HistoryLength::DEFAULT;
        log.apply(Kind::Lock, &acquired(7, 1000, 10_000), at(10_000), len);
        log.apply(Kind::Lock, &Change::Released { fence: 7 }, at(10_400), len);
        let entries: Vec<_> = log.entries().cloned().collect();
        assert_eq!(entries.len(), 1);
        let end = entries[0].ended.as_ref().expect("ended");
        assert_eq!(end.how, Ending::Released);
        assert_eq!(entries[0].held_for(at(99_999)), Duration::from_millis(400));
        assert_eq!(entries[0].mode, Some(Mode::Exclusive));
    }

    #[test]
    fn an_extend_moves_the_lease_end_and_settle_expires_there() {
        let mut log = HistoryLog::default();
        let len = HistoryLength::DEFAULT;
        log.apply(Kind::Lock, &acquired(7, 1000, 10_000), at(10_000), len);
        let extend = Change::Extended {
            fence: 7,
            ttl_ms: 5000,
            at_ms: Some(10_500),
        };
        log.apply(Kind::Lock, &extend, at(10_500), len);
        let read: Vec<_> = log.entries().cloned().collect();
        let live = settle(read.clone(), &[7], at(12_000));
        assert!(live[0].ended.is_none(), "a live fence stays open");
        let gone = settle(read, &[], at(60_000));
        let end = gone[0].ended.as_ref().expect("settled");
        assert_eq!((end.how, end.at), (Ending::Expired, at(15_500)));
    }

    #[test]
    fn a_lease_gone_before_its_end_expires_when_read() {
        let entry = HistoryEntry {
            fence: 1,
            mode: None,
            owner: None,
            meta: None,
            granted_at: at(0),
            expires_at: at(100_000),
            ended: None,
        };
        let read = settle(vec![entry], &[], at(5000));
        assert_eq!(read[0].ended.as_ref().map(|e| e.at), Some(at(5000)));
    }

    #[test]
    fn the_log_keeps_its_length_newest_first() {
        let mut log = HistoryLog::default();
        let len = HistoryLength::new(3).expect("valid");
        for fence in 1..=5 {
            log.apply(Kind::Lock, &acquired(fence, 10, fence), at(fence), len);
            log.apply(Kind::Lock, &Change::Released { fence }, at(fence), len);
        }
        let fences: Vec<u64> = log.entries().map(|e| e.fence).collect();
        assert_eq!(fences, vec![5, 4, 3]);
    }

    #[test]
    fn a_run_release_is_an_abandonment_and_a_permit_has_no_mode() {
        let mut run = HistoryLog::default();
        let len = HistoryLength::DEFAULT;
        run.apply(Kind::Run, &acquired(3, 1000, 0), at(0), len);
        run.apply(Kind::Run, &Change::Released { fence: 3 }, at(1), len);
        let entry = run.entries().next().expect("kept");
        assert_eq!(entry.ended.as_ref().map(|e| e.how), Some(Ending::Abandoned));
        assert_eq!(entry.mode, None);
    }

    #[test]
    fn a_break_records_who_broke_it() {
        let mut log = HistoryLog::default();
        let len = HistoryLength::DEFAULT;
        log.apply(Kind::Semaphore, &acquired(3, 1000, 0), at(0), len);
        let broken = Change::Broken {
            fence: 3,
            by: Some("ops".into()),
        };
        log.apply(Kind::Semaphore, &broken, at(1), len);
        let end = log
            .entries()
            .next()
            .and_then(|e| e.ended.clone())
            .expect("ended");
        assert_eq!((end.how, end.by.as_deref()), (Ending::Broken, Some("ops")));
    }

    #[test]
    fn no_history_keeps_nothing() {
        let mut log = HistoryLog::default();
        log.apply(Kind::Lock, &acquired(1, 10, 0), at(0), HistoryLength::OFF);
        assert_eq!(log.entries().count(), 0);
    }

    #[test]
    fn merge_prefers_a_holders_end_over_an_inferred_expiry() {
        let open = HistoryEntry {
            fence: 9,
            mode: Some(Mode::Exclusive),
            owner: None,
            meta: None,
            granted_at: at(0),
            expires_at: at(1000),
            ended: None,
        };
        let expired = settle(vec![open.clone()], &[], at(2000));
        let mut released = open.clone();
        released.ended = Some(Ended {
            how: Ending::Released,
            at: at(500),
            by: None,
        });
        let merged = merge(vec![
            expired.clone(),
            vec![released.clone()],
            vec![open.clone()],
        ]);
        assert_eq!(merged, vec![released]);
        let merged = merge(vec![expired, vec![open.clone()]]);
        assert_eq!(merged, vec![open]);
    }

    #[test]
    fn ending_names_round_trip() {
        for how in [
            Ending::Released,
            Ending::Expired,
            Ending::Broken,
            Ending::Abandoned,
            Ending::Completed,
        ] {
            assert_eq!(Ending::parse(how.as_str()), Some(how));
        }
        assert_eq!(Ending::parse("gone"), None);
    }
}
