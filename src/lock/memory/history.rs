//! Histories and breaks in memory: every change the backend tells is
//! folded into its subject's [`HistoryLog`] (the rules the Redis scripts
//! follow in `history.lua`), and a history is read with the fences that
//! hold the subject at that moment, under the same lock.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{MemoryBackend, State};
use crate::lock::history::{self, BrokenLease, HistoryEntry, HistoryLength, HistoryLog};
use crate::lock::run::RunInfo;
use crate::lock::{Change, Kind, LockError, LockName, Mode, Subject};

/// The histories of every subject, each kept for the fence retention
/// past its last lease's end (as the Redis list's TTL).
#[derive(Default)]
pub(super) struct Histories {
    logs: HashMap<Subject, (HistoryLog, Instant)>,
    /// Changes folded, to sweep every [`super::SWEEP_EVERY`] of them.
    changes: u64,
}

impl Histories {
    /// Folds `change` of `subject` into its history, kept `retention`
    /// past the lease end it tells of.
    pub(super) fn fold(
        &mut self,
        subject: &Subject,
        change: &Change,
        length: HistoryLength,
        retention: Duration,
    ) {
        let lasts = match change {
            Change::Acquired { ttl_ms, .. } | Change::Extended { ttl_ms, .. } => {
                Some(Duration::from_millis(*ttl_ms))
            }
            Change::Probe(_) | Change::Unknown => return,
            _ => None,
        };
        if length.is_off() {
            return;
        }
        let now = Instant::now();
        self.changes += 1;
        if self.changes.is_multiple_of(super::SWEEP_EVERY) {
            self.logs.retain(|_, (_, forget_at)| *forget_at > now);
        }
        let (log, forget_at) = self
            .logs
            .entry(subject.clone())
            .or_insert_with(|| (HistoryLog::default(), now));
        if *forget_at <= now {
            *log = HistoryLog::default();
        }
        if let Some(lasts) = lasts {
            *forget_at = (*forget_at).max(now + lasts + retention);
        }
        log.apply(subject.kind(), change, SystemTime::now(), length);
    }

    /// The entries kept of `subject`, newest first.
    fn entries(&self, subject: &Subject) -> Vec<HistoryEntry> {
        let now = Instant::now();
        self.logs
            .get(subject)
            .filter(|(_, forget_at)| *forget_at > now)
            .map(|(log, _)| log.entries().cloned().collect())
            .unwrap_or_default()
    }

    /// See [`HistoryLog::refence`].
    pub(super) fn refence(&mut self, subject: &Subject, old: u64, new: u64) {
        if let Some((log, _)) = self.logs.get_mut(subject) {
            log.refence(old, new);
        }
    }
}

impl MemoryBackend {
    /// As [`crate::lock::Node::history`].
    pub(super) fn read_history(&self, subject: &Subject) -> Vec<HistoryEntry> {
        let now = Instant::now();
        let mut state = self.state();
        let name = subject.name();
        let live: Vec<u64> = match subject.kind() {
            Kind::Lock => self
                .holder_in(&mut state, name, now)
                .map(|(_, info)| info.fences())
                .unwrap_or_default(),
            Kind::Semaphore => self
                .inspect_in(&mut state, name)
                .map(|info| info.permits.iter().map(|p| p.fence).collect())
                .unwrap_or_default(),
            Kind::Run => match Self::read_run(&mut state, name, now) {
                Some(RunInfo::Running { fence, .. }) => vec![fence],
                _ => Vec::new(),
            },
        };
        let entries = self.histories().entries(subject);
        drop(state);
        history::settle(entries, &live, SystemTime::now())
    }

    /// As [`crate::lock::Node::break_leases`].
    pub(super) fn break_held(
        &self,
        subject: &Subject,
        fence: Option<u64>,
        by: &str,
    ) -> Result<Vec<BrokenLease>, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        let name = subject.name();
        let broken = match subject.kind() {
            Kind::Lock => self.break_lock(&mut state, name, fence, now),
            Kind::Semaphore => {
                let at = self.now_us();
                match state.semaphores.get_mut(name.as_str()) {
                    Some(permits) => {
                        let broken = permits.break_held(at, fence, None);
                        self.tell_ended(name, permits);
                        broken
                    }
                    None => Vec::new(),
                }
            }
            Kind::Run => self.break_run(&mut state, name, fence, now),
        };
        for lease in &broken {
            let change = Change::Broken {
                fence: lease.fence,
                by: Some(by.to_owned()).filter(|b| !b.is_empty()),
            };
            self.tell(subject.kind(), name, &change);
        }
        drop(state);
        Ok(broken)
    }

    /// Ends the exclusive holder of `name`, or its shared leases.
    fn break_lock(
        &self,
        state: &mut State,
        name: &LockName,
        fence: Option<u64>,
        now: Instant,
    ) -> Vec<BrokenLease> {
        if let Some(holder) = state.live(name, now) {
            if fence.is_some_and(|f| f != holder.fence) {
                return Vec::new();
            }
            let lease = BrokenLease {
                fence: holder.fence,
                mode: Some(Mode::Exclusive),
                owner: holder.owner.clone(),
                meta: holder.meta.clone(),
            };
            state.holders.remove(name.as_str());
            return vec![lease];
        }
        let at = self.now_us();
        match state.shared.get_mut(name.as_str()) {
            Some(shared) => {
                let broken = shared.break_leases(at, fence);
                self.tell_ended_shared(name, shared);
                broken
            }
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::history::Ending;
    use crate::lock::{AcquireRequest, LockNode, Node, Token, Ttl};

    fn request(name: &str, token: &Token) -> AcquireRequest {
        AcquireRequest {
            name: LockName::parse(name).expect("valid name"),
            token: token.clone(),
            ttl: Ttl::from_millis(1000, u64::MAX, "ttl_ms").expect("valid ttl"),
            owner: Some(crate::lock::Owner::parse("w").expect("valid")),
            meta: None,
            token_generated: true,
            mode: Mode::Exclusive,
            waits_until: None,
            renew_only: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_lock_is_free_and_its_history_says_who_broke_it() {
        let store = MemoryBackend::new();
        let name = LockName::parse("k").expect("valid");
        let subject = Subject::lock(name.clone());
        let token = Token::generate();
        let lease = store.acquire(&request("k", &token)).await.expect("free");
        let broken = store
            .break_leases(&subject, None, "ops")
            .await
            .expect("broken");
        assert_eq!(broken.len(), 1);
        assert_eq!(broken[0].fence, lease.lease().fence);
        assert!(store.holder(&name).await.expect("read").is_none());
        let history = store.history(&subject).await.expect("read");
        let end = history[0].ended.clone().expect("ended");
        assert_eq!((end.how, end.by.as_deref()), (Ending::Broken, Some("ops")));
        let again = store.break_leases(&subject, None, "ops").await;
        assert_eq!(again.expect("nothing to break"), Vec::new());
    }
}
