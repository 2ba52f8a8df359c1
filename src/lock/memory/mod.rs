//! An in-process backend with the same semantics as the Redis one, for
//! `lockd serve --dev` and tests. Locks live in this process only: two lockd
//! processes never see each other's locks.
//!
//! This file keeps the locks; `shared` their shared leases (and the
//! writers waiting for them), `semaphores` the permits, `runs` the runs,
//! `listing` the walk of the held names in order, and `history` every
//! name's history (folded from the changes told) and the breaks.
//!
//! A std [`Mutex`] is right here (as in mini-redis's `db.rs`): the critical
//! sections are short, never await, and a tokio mutex would only add cost.

use crate::lock::ProbedLock;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::fence::{self, DEFAULT_RETENTION, unix_micros};
use super::history::{BrokenLease, HistoryEntry, HistoryLength};

mod history;
mod listing;
mod runs;
mod semaphores;
mod shared;
use super::listing::{NamePrefix, PageSize, Position, ScanPage};
use super::run::ProbedRun;
use super::run::{
    Attempt as RunAttempt, Completed, RunInfo, RunMiss, RunResult, StartRefusal, StartRequest,
    Started,
};
use super::semaphore::{Permit, PermitOutcome, PermitRequest, Refusal, SemaphoreInfo};
use super::{
    AcquireRequest, Acquired, Change, ChangeListener, ExtendTtl, Kind, Lease, LeaseLeft, LockError,
    LockInfo, LockName, LockNode, Meta, Mode, Node, Released, RunNode, SemaphoreNode, Subject,
    Token, Ttl, WaitInterest, unix_millis,
};

struct Holder {
    token: Token,
    fence: u64,
    owner: Option<String>,
    meta: Option<Meta>,
    granted_at: SystemTime,
    /// The lock's own TTL, for an extend that names none.
    ttl: Ttl,
    expires: Instant,
}

/// A fencing counter: the last fence, kept until `forget_at`.
struct Counter {
    fence: u64,
    forget_at: Instant,
}

impl Holder {
    /// What an observer may know of this holder at `now`: never its token.
    fn info(&self, now: Instant) -> LockInfo {
        LockInfo::exclusive(
            Some(self.fence),
            Some(self.expires - now),
            self.owner.clone(),
            self.meta.clone(),
            Some(self.granted_at),
        )
    }
}

#[derive(Default)]
struct State {
    /// Ordered by name, so that a listing walks them in order.
    holders: BTreeMap<String, Holder>,
    /// Grants made, to sweep every [`SWEEP_EVERY`] of them.
    grants: u64,
    /// Fencing counters. Like Redis's `:fence` keys they are kept for the
    /// fence retention after a lock's last grant; the process's wall clock
    /// keeps fences growing after that (see [`fence`]).
    fences: HashMap<String, Counter>,
    /// The shared leases of locks, by name, and the exclusive requests
    /// waiting for them (see `shared`). Their fences come from `fences`.
    shared: BTreeMap<String, shared::SharedLock>,
    /// Semaphores (see [`super::semaphore`]), and their fencing counters.
    semaphores: BTreeMap<String, super::semaphore::Permits>,
    semaphore_fences: HashMap<String, Counter>,
    /// Runs (see [`super::run`]), ordered by key, and their fencing
    /// counters.
    runs: BTreeMap<String, runs::RunRecord>,
    run_fences: HashMap<String, Counter>,
}

impl State {
    /// The live holder of `name`, dropping an expired one first.
    fn live(&mut self, name: &LockName, now: Instant) -> Option<&mut Holder> {
        if self
            .holders
            .get(name.as_str())
            .is_some_and(|h| h.expires <= now)
        {
            self.holders.remove(name.as_str());
        }
        self.holders.get_mut(name.as_str())
    }

    /// Drops every expired holder and forgotten counter, so that names used
    /// once do not pile up.
    fn sweep(&mut self, now: Instant, at_us: u64) {
        self.holders.retain(|_, h| h.expires > now);
        self.shared.retain(|_, lock| !lock.is_spent(now, at_us));
        self.fences.retain(|_, c| c.forget_at > now);
        self.semaphore_fences.retain(|_, c| c.forget_at > now);
        self.runs.retain(|_, r| r.forget_at > now);
        self.run_fences.retain(|_, c| c.forget_at > now);
    }

    /// The next fence of `name` by the rule of [`fence::next_fence`], kept
    /// for `retention`.
    fn next_fence(&mut self, name: &LockName, now: Instant, retention: Duration) -> u64 {
        next_fence_in(&mut self.fences, name, now, retention)
    }
}

/// The next fence of `name` among `fences`, by the rule of
/// [`fence::next_fence`], kept for `retention`.
fn next_fence_in(
    fences: &mut HashMap<String, Counter>,
    name: &LockName,
    now: Instant,
    retention: Duration,
) -> u64 {
    {
        let stored = fences
            .get(name.as_str())
            .filter(|c| c.forget_at > now)
            .map(|c| c.fence);
        // The clock alone never passes 2^53 - 1, and lockd's own counters
        // stay below it, so there is no foreign counter to refuse here.
        let fence =
            fence::next_fence(stored, unix_micros(SystemTime::now())).unwrap_or(fence::MAX_FENCE);
        fences.insert(
            name.as_str().to_owned(),
            Counter {
                fence,
                forget_at: now + retention,
            },
        );
        fence
    }
}

/// Locks in this process's memory.
pub struct MemoryBackend {
    state: Mutex<State>,
    /// Told about every release, so that waiters wake at once.
    listener: OnceLock<Arc<dyn ChangeListener>>,
    fence_retention: Duration,
    /// The origin of the semaphores' millisecond clock.
    origin: Instant,
    /// Every subject's history, folded from the changes told. Locked
    /// after `state`, never before.
    histories: Mutex<history::Histories>,
    history_length: HistoryLength,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// An empty store, keeping fencing counters for the default retention
    /// (one hour).
    pub fn new() -> Self {
        Self::with_fence_retention(DEFAULT_RETENTION)
    }

    /// An empty store, keeping each fencing counter for `retention` after
    /// its lock's last grant.
    pub fn with_fence_retention(retention: Duration) -> Self {
        Self {
            state: Mutex::default(),
            listener: OnceLock::new(),
            fence_retention: retention,
            origin: Instant::now(),
            histories: Mutex::default(),
            history_length: HistoryLength::DEFAULT,
        }
    }

    /// This store, keeping `length` entries of each name's history.
    #[must_use]
    pub fn with_history_length(mut self, length: HistoryLength) -> Self {
        self.history_length = length;
        self
    }

    fn histories(&self) -> MutexGuard<'_, history::Histories> {
        self.histories.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many fencing counters are kept now. For tests that check names
    /// used once leave nothing behind.
    pub fn fence_count(&self) -> usize {
        let mut state = self.state();
        state.sweep(Instant::now(), self.now_us());
        state.fences.len()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated
        // in a way that breaks mutual exclusion, so a poisoned lock is used.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The token and remaining lease of the holder of `name`, if any. For
    /// tests that check what the store holds, as they read Redis keys for the
    /// Redis backend.
    pub fn peek(&self, name: &str) -> Option<(String, Duration)> {
        let name = LockName::parse(name).ok()?;
        let now = Instant::now();
        let mut state = self.state();
        state
            .live(&name, now)
            .map(|h| (h.token.expose().to_owned(), h.expires - now))
    }

    /// Forgets every lock and fencing counter, as a Redis that restarted
    /// without persistence would. For tests of Redlock's fencing.
    pub fn lose_data(&self) {
        *self.state() = State::default();
    }

    /// Records in its history, and tells the listener, that the `kind`
    /// of lease named `name` changed. Called while the state is locked, so
    /// that the changes of a subject are recorded and told in the order
    /// they were made (the listener never calls back into the store).
    fn tell(&self, kind: Kind, name: &LockName, change: &Change) {
        let subject = Subject::new(kind, name.clone());
        self.histories()
            .fold(&subject, change, self.history_length, self.fence_retention);
        if let Some(listener) = self.listener.get() {
            listener.changed(&subject, change);
        }
    }

    /// How many locks are held now.
    pub fn held_count(&self) -> usize {
        let mut state = self.state();
        state.sweep(Instant::now(), self.now_us());
        state.holders.len()
    }
}

impl MemoryBackend {
    /// Releases `token`'s lease of `name`: the exclusive one, or else its
    /// shared one.
    fn release_held(
        &self,
        state: &mut State,
        name: &LockName,
        token: &Token,
        now: Instant,
    ) -> Result<Released, LockError> {
        let Some(holder) = state.live(name, now) else {
            return self.release_shared(state, name, token);
        };
        if &holder.token != token {
            return Err(LockError::NotOwner);
        }
        let (granted_at, fence) = (holder.granted_at, holder.fence);
        state.holders.remove(name.as_str());
        self.tell(Kind::Lock, name, &Change::Released { fence });
        Ok(Released {
            granted_at: Some(granted_at),
            mode: Mode::Exclusive,
        })
    }

    /// The holder of `name`: its exclusive holder (and token), or its
    /// shared leases (with no token); `None` when it is free.
    fn holder_in(
        &self,
        state: &mut State,
        name: &LockName,
        now: Instant,
    ) -> Option<(Token, LockInfo)> {
        let writer_waiting = self.writer_waits(state, name, now);
        if let Some(holder) = state.live(name, now) {
            let mut info = holder.info(now);
            info.writer_waiting = writer_waiting;
            return Some((holder.token.clone(), info));
        }
        self.inspect_shared(state, name, now)
            .map(|info| (Token::from_stored(String::new()), info))
    }
}

fn lease(fence: u64, ttl: Ttl) -> Lease {
    Lease {
        fence,
        ttl,
        set_to: ttl,
        expires_at: SystemTime::now() + ttl.as_duration(),
    }
}

/// Sweep expired holders (and semaphores) once every this many grants of
/// locks or permits.
const SWEEP_EVERY: u64 = 1024;

#[async_trait]
impl Node for MemoryBackend {
    async fn scan(
        &self,
        kind: Kind,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<ScanPage, LockError> {
        MemoryBackend::scan(self, kind, prefix, at, limit)
    }

    async fn ping(&self) -> Result<(), LockError> {
        Ok(())
    }

    async fn history(&self, subject: &Subject) -> Result<Vec<HistoryEntry>, LockError> {
        Ok(self.read_history(subject))
    }

    async fn break_leases(
        &self,
        subject: &Subject,
        fence: Option<u64>,
        by: &str,
    ) -> Result<Vec<BrokenLease>, LockError> {
        self.break_held(subject, fence, by)
    }

    fn watch_releases(
        &self,
        listener: Arc<dyn ChangeListener>,
        _stop: CancellationToken,
    ) -> Option<Arc<dyn WaitInterest>> {
        if self.listener.set(listener).is_err() {
            tracing::warn!("the memory backend already has a release listener; keeping the first");
        }
        None
    }
}

#[async_trait]
impl LockNode for MemoryBackend {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        if req.mode == Mode::Shared {
            return self.acquire_shared(&mut state, req, now);
        }
        if let Some(refused) = self.refuse_beside_shared(&mut state, req, now) {
            return Err(refused);
        }
        if let Some(holder) = state.live(&req.name, now) {
            if holder.token != req.token {
                return Err(LockError::Held {
                    left: LeaseLeft::AtMost((holder.expires - now).max(Duration::from_millis(1))),
                });
            }
            holder.expires = now + req.ttl.as_duration();
            holder.ttl = req.ttl;
            if let Some(owner) = &req.owner {
                holder.owner = Some(owner.as_str().to_owned());
            }
            if let Some(meta) = &req.meta {
                holder.meta = Some(meta.clone());
            }
            let fence = holder.fence;
            let ttl_ms = req.ttl.as_millis();
            let at_ms = Some(unix_millis(SystemTime::now()));
            let change = Change::Extended {
                fence,
                ttl_ms,
                at_ms,
            };
            self.tell(Kind::Lock, &req.name, &change);
            return Ok(Acquired::Renewed(lease(fence, req.ttl)));
        }
        if req.renew_only {
            return Err(LockError::Held {
                left: LeaseLeft::AtMost(Duration::from_millis(1)),
            });
        }
        let fence = state.next_fence(&req.name, now, self.fence_retention);
        if let Some(lock) = state.shared.get_mut(req.name.as_str()) {
            lock.forget_writer(&req.token);
        }
        state.grants += 1;
        if state.grants.is_multiple_of(SWEEP_EVERY) {
            state.sweep(now, self.now_us());
        }
        let granted_at = SystemTime::now();
        let owner = req.owner.as_ref().map(|o| o.as_str().to_owned());
        state.holders.insert(
            req.name.as_str().to_owned(),
            Holder {
                token: req.token.clone(),
                fence,
                owner: owner.clone(),
                meta: req.meta.clone(),
                granted_at,
                ttl: req.ttl,
                expires: now + req.ttl.as_duration(),
            },
        );
        let change = Change::Acquired {
            fence,
            ttl_ms: req.ttl.as_millis(),
            granted_at_ms: unix_millis(granted_at),
            owner,
            meta: req.meta.clone(),
            mode: Mode::Exclusive,
        };
        self.tell(Kind::Lock, &req.name, &change);
        drop(state);
        Ok(Acquired::Granted(lease(fence, req.ttl)))
    }

    async fn extend(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Lease, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        let Some(holder) = state.live(name, now) else {
            return self.extend_shared(&mut state, name, token, ttl);
        };
        if &holder.token != token {
            return Err(LockError::NotOwner);
        }
        let ttl = match ttl {
            ExtendTtl::To(ttl) => ttl,
            ExtendTtl::Own { .. } => holder.ttl,
        };
        holder.ttl = ttl;
        holder.expires = now + ttl.as_duration();
        let fence = holder.fence;
        // Waiters learn the new lease end (an extend may shorten it).
        let ttl_ms = ttl.as_millis();
        let at_ms = Some(unix_millis(SystemTime::now()));
        let change = Change::Extended {
            fence,
            ttl_ms,
            at_ms,
        };
        self.tell(Kind::Lock, name, &change);
        drop(state);
        Ok(lease(fence, ttl))
    }

    async fn release(&self, name: &LockName, token: &Token) -> Result<Released, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        let released = self.release_held(&mut state, name, token, now);
        if released.is_err() {
            self.withdraw_writer(&mut state, name, token);
        }
        released
    }

    async fn holder(&self, name: &LockName) -> Result<Option<(Token, LockInfo)>, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        Ok(self.holder_in(&mut state, name, now))
    }

    async fn probe(&self, name: &LockName, marker: &str) -> Result<ProbedLock, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        let holder = self.holder_in(&mut state, name, now).map(|(_, info)| info);
        let counter = state
            .fences
            .get(name.as_str())
            .filter(|c| c.forget_at > now)
            .map(|c| c.fence);
        self.tell(Kind::Lock, name, &Change::Probe(marker.to_owned()));
        drop(state);
        Ok(ProbedLock { holder, counter })
    }

    async fn raise_fence(
        &self,
        name: &LockName,
        token: &Token,
        fence: u64,
    ) -> Result<bool, LockError> {
        let now = Instant::now();
        let mut state = self.state();
        let retention = self.fence_retention;
        let counter = state
            .fences
            .entry(name.as_str().to_owned())
            .or_insert(Counter {
                fence: 0,
                forget_at: now,
            });
        if counter.forget_at <= now {
            counter.fence = 0;
        }
        counter.fence = counter.fence.max(fence);
        counter.forget_at = now + retention;
        let Some(holder) = state.live(name, now).filter(|h| &h.token == token) else {
            return Ok(false);
        };
        let before = std::mem::replace(&mut holder.fence, fence);
        if before != fence {
            self.histories()
                .refence(&Subject::lock(name.clone()), before, fence);
        }
        Ok(true)
    }
}

#[async_trait]
impl SemaphoreNode for MemoryBackend {
    async fn probe_semaphore(
        &self,
        name: &LockName,
        marker: &str,
    ) -> Result<crate::lock::semaphore::ProbedSemaphore, LockError> {
        MemoryBackend::probe_semaphore(self, name, marker)
    }

    async fn take_permit(
        &self,
        req: &PermitRequest,
    ) -> Result<Result<PermitOutcome, Refusal>, LockError> {
        MemoryBackend::take_permit(self, req)
    }

    async fn give_back_permit(
        &self,
        name: &LockName,
        token: &Token,
    ) -> Result<Option<Released>, LockError> {
        MemoryBackend::give_back_permit(self, name, token)
    }

    async fn extend_permit(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Option<Permit>, LockError> {
        MemoryBackend::extend_permit(self, name, token, ttl)
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>, LockError> {
        MemoryBackend::inspect_semaphore(self, name)
    }
}

#[async_trait]
impl RunNode for MemoryBackend {
    async fn start_run(
        &self,
        req: &StartRequest,
    ) -> Result<Result<Started, StartRefusal>, LockError> {
        MemoryBackend::start_run(self, req)
    }

    async fn complete_run(
        &self,
        key: &LockName,
        token: &Token,
        result: &RunResult,
        retention: Duration,
    ) -> Result<Result<Completed, RunMiss>, LockError> {
        MemoryBackend::complete_run(self, key, token, result, retention)
    }

    async fn abandon_run(
        &self,
        key: &LockName,
        token: &Token,
        retention: Duration,
    ) -> Result<Result<(), RunMiss>, LockError> {
        MemoryBackend::abandon_run(self, key, token, retention)
    }

    async fn extend_run(
        &self,
        key: &LockName,
        token: &Token,
        ttl: ExtendTtl,
        retention: Duration,
    ) -> Result<Result<RunAttempt, RunMiss>, LockError> {
        MemoryBackend::extend_run(self, key, token, ttl, retention)
    }

    async fn inspect_run(&self, key: &LockName) -> Result<Option<RunInfo>, LockError> {
        MemoryBackend::inspect_run(self, key)
    }

    async fn probe_run(&self, key: &LockName, marker: &str) -> Result<ProbedRun, LockError> {
        MemoryBackend::probe_run(self, key, marker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &str, token: &Token, ttl_ms: u64) -> AcquireRequest {
        AcquireRequest {
            name: LockName::parse(name).expect("valid name"),
            token: token.clone(),
            ttl: Ttl::from_millis(ttl_ms, u64::MAX, "ttl_ms").expect("valid ttl"),
            owner: None,
            meta: None,
            token_generated: true,
            mode: crate::lock::Mode::Exclusive,
            waits_until: None,
            renew_only: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_runs_out_after_its_ttl_and_the_fence_grows() {
        let store = MemoryBackend::new();
        let (a, b) = (Token::generate(), Token::generate());
        let first = store.acquire(&request("k", &a, 100)).await.expect("free");
        assert!(matches!(
            store.acquire(&request("k", &b, 100)).await,
            Err(LockError::Held { .. })
        ));
        tokio::time::advance(Duration::from_millis(101)).await;
        let second = store
            .acquire(&request("k", &b, 100))
            .await
            .expect("expired");
        assert!(second.lease().fence > first.lease().fence);
        let name = LockName::parse("k").expect("valid");
        assert!(matches!(
            store.release(&name, &a).await,
            Err(LockError::NotOwner)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn counters_are_forgotten_after_the_retention_and_fences_still_grow() {
        let store = MemoryBackend::with_fence_retention(Duration::from_secs(1));
        let name = LockName::parse("k").expect("valid");
        let a = Token::generate();
        let first = store.acquire(&request("k", &a, 100)).await.expect("free");
        store.release(&name, &a).await.expect("held");
        assert_eq!(store.fence_count(), 1, "kept for the retention");
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(store.fence_count(), 0, "forgotten after it");
        let b = Token::generate();
        let second = store.acquire(&request("k", &b, 100)).await.expect("free");
        assert!(
            second.lease().fence > first.lease().fence,
            "the process clock keeps fences growing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn held_reports_the_remaining_lease() {
        let store = MemoryBackend::new();
        store
            .acquire(&request("k", &Token::generate(), 1000))
            .await
            .expect("free");
        tokio::time::advance(Duration::from_millis(400)).await;
        match store.acquire(&request("k", &Token::generate(), 1000)).await {
            Err(LockError::Held { left }) => {
                assert_eq!(left, LeaseLeft::AtMost(Duration::from_millis(600)));
            }
            other => panic!("expected Held, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn extend_never_revives_an_expired_lock() {
        let store = MemoryBackend::new();
        let a = Token::generate();
        store.acquire(&request("k", &a, 50)).await.expect("free");
        tokio::time::advance(Duration::from_millis(60)).await;
        let name = LockName::parse("k").expect("valid");
        let ttl = Ttl::from_millis(5000, u64::MAX, "ttl_ms").expect("valid");
        assert!(matches!(
            store.extend(&name, &a, ExtendTtl::To(ttl)).await,
            Err(LockError::NotHeld)
        ));
        assert_eq!(store.held_count(), 0);
    }
}
