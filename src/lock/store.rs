//! [`Store`]: what [`super::Locks`] calls, made of one or more lock
//! servers ([`super::node`]). [`Single`] is one backend as it is (a Redis
//! server, the master a Sentinel set names, a Redis Cluster, or memory:
//! the Redis topologies are the backend's own); [`super::redlock`] spreads
//! each lock over several independent masters.
//!
//! A store is split by kind of lease as a node is: [`LockStore`] for locks,
//! [`SemaphoreStore`] for semaphores, [`RunStore`] for runs, and [`Store`] for what they share
//! (readiness, change events, watches) and to reach each kind. A store
//! without a kind says so once, in its accessor ([`Store::semaphores`]),
//! with the reason, rather than in every method of that kind.
//!
//! No method returns a token: a lock's token is known to the caller that
//! chose or was given it, and to no one else (`inspect` gives a
//! [`LockInfo`] only).

use crate::lock::ProbedLock;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::history::{BrokenLease, HistoryEntry};
use super::listing::{LockEntry, NamePrefix, Page, PageSize, Position, RunEntry, SemaphoreEntry};
use super::run::ProbedRun;
use super::run::{
    Attempt, Completed, RunInfo, RunMiss, RunResult, StartRefusal, StartRequest, Started,
};
use super::semaphore::{Permit, PermitOutcome, PermitRequest, Refusal, SemaphoreInfo};
use super::{
    AcquireRequest, Acquired, Backend, ChangeListener, ExtendTtl, Kind, Lease, LockError, LockInfo,
    LockName, Released, Subject, Token, WaitInterest,
};

/// A lock store: its kinds of lease, and what they share. Every store
/// gives the same answers for the same sequence of calls; the HTTP
/// conformance tests (`backend_tests!`) run against each of them.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Its locks. Every store has them.
    fn locks(&self) -> &dyn LockStore;

    /// Its semaphores.
    ///
    /// # Errors
    /// [`LockError::Unsupported`], with the reason, from a store without
    /// them (Redlock).
    fn semaphores(&self) -> Result<&dyn SemaphoreStore, LockError>;

    /// Its runs.
    ///
    /// # Errors
    /// [`LockError::Unsupported`], with the reason, from a store without
    /// them (Redlock).
    fn runs(&self) -> Result<&dyn RunStore, LockError>;

    /// Whether `subject` can be watched here (its kind kept, and its
    /// changes told on one stream).
    ///
    /// # Errors
    /// [`LockError::Unsupported`], with the reason, when it cannot.
    fn watchable(&self, subject: &Subject) -> Result<(), LockError>;

    /// Checks that the store answers, for `/readyz`.
    ///
    /// # Errors
    /// [`LockError::Unavailable`], [`LockError::QuorumUnavailable`] or
    /// [`LockError::Backend`] when the store fails.
    async fn ping(&self) -> Result<(), LockError>;

    /// The history of `subject` (see [`super::Node::history`]; Redlock
    /// merges its nodes', [`super::history::merge`]).
    ///
    /// # Errors
    /// [`LockError::Unsupported`] for a kind the store does not keep; a
    /// store failure as for [`LockStore::acquire`].
    async fn history(&self, subject: &Subject) -> Result<Vec<HistoryEntry>, LockError>;

    /// Ends the live leases of `subject` whatever their token (see
    /// [`super::Node::break_leases`]; Redlock on every node it reaches).
    ///
    /// # Errors
    /// [`LockError::Unsupported`] for a kind the store does not keep; a
    /// store failure as for [`LockStore::acquire`].
    async fn break_leases(
        &self,
        subject: &Subject,
        fence: Option<u64>,
        by: &str,
    ) -> Result<Vec<BrokenLease>, LockError>;

    /// Starts telling `listener` about releases and extends, on every node,
    /// until `stop` is cancelled; returns the [`WaitInterest`] to tell
    /// which locks are waited for when the store hears only those (see
    /// [`super::Node::watch_releases`]).
    fn watch_releases(
        &self,
        listener: Arc<dyn ChangeListener>,
        stop: CancellationToken,
    ) -> Option<Arc<dyn WaitInterest>>;
}

/// The locks of a store.
#[async_trait]
pub trait LockStore: Send + Sync {
    /// Takes the lock if it is free, or renews it if `req.token` already
    /// holds it.
    ///
    /// # Errors
    /// [`LockError::Held`] with the holder's remaining lease when another
    /// token holds it; [`LockError::Unavailable`],
    /// [`LockError::QuorumUnavailable`] or [`LockError::Backend`] when the
    /// store fails.
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired, LockError>;

    /// Resets the lease of a lock held by `token` to `ttl`. Never creates a
    /// lock.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when nobody holds it, [`LockError::NotOwner`]
    /// when another token does, or a store failure as for
    /// [`LockStore::acquire`].
    async fn extend(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Lease, LockError>;

    /// Releases a lock held by `token` (compare-and-delete), and tells when
    /// it was granted.
    ///
    /// # Errors
    /// As for [`LockStore::extend`].
    async fn release(&self, name: &LockName, token: &Token) -> Result<Released, LockError>;

    /// Releases a lock held by `token` and, when that freed it, may try
    /// `next` after it (see [`super::LockNode::release_handing`]). This
    /// default (Redlock's, whose nodes other instances share) only
    /// releases: every instance's waiters are woken by the release, as
    /// for any release.
    ///
    /// # Errors
    /// As for [`LockStore::release`]; the try's failure is in its answer.
    async fn release_handing(
        &self,
        name: &LockName,
        token: &Token,
        next: &AcquireRequest,
    ) -> Result<(Released, Option<Result<Acquired, LockError>>), LockError> {
        let _ = next;
        Ok((self.release(name, token).await?, None))
    }

    /// Describes the current holder (never its token), or `None` when the
    /// lock is free.
    ///
    /// # Errors
    /// A store failure as for [`LockStore::acquire`].
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError>;

    /// Describes a lock and publishes a watcher's marker in the same step
    /// (see [`super::LockNode::probe`]).
    ///
    /// # Errors
    /// As for [`LockStore::acquire`]; [`LockError::Unsupported`] from a
    /// store whose locks cannot be watched (Redlock, which
    /// [`Store::watchable`] says first).
    async fn probe(&self, name: &LockName, marker: &str) -> Result<ProbedLock, LockError>;

    /// One page of the held locks whose names start with `prefix`, from
    /// `at` (see [`super::listing`]): at most `limit` of them, never a
    /// token, and where the walk goes on.
    ///
    /// # Errors
    /// [`LockError::BadCursor`] when `at` is not a position of this store;
    /// a store failure as for [`LockStore::acquire`].
    async fn list_locks(
        &self,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<Page<LockEntry>, LockError>;
}

/// The semaphores of a store (see [`super::semaphore`]).
#[async_trait]
pub trait SemaphoreStore: Send + Sync {
    /// Takes one permit (see [`super::SemaphoreNode::take_permit`]).
    ///
    /// # Errors
    /// As for [`super::SemaphoreNode::take_permit`].
    async fn take_permit(
        &self,
        req: &PermitRequest,
    ) -> Result<Result<PermitOutcome, Refusal>, LockError>;

    /// Gives back a permit (see [`super::SemaphoreNode::give_back_permit`]).
    ///
    /// # Errors
    /// A store failure as for [`LockStore::acquire`].
    async fn give_back_permit(
        &self,
        name: &LockName,
        token: &Token,
    ) -> Result<Option<Released>, LockError>;

    /// Extends a permit (see [`super::SemaphoreNode::extend_permit`]).
    ///
    /// # Errors
    /// A store failure as for [`LockStore::acquire`].
    async fn extend_permit(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Option<Permit>, LockError>;

    /// Describes a semaphore (see [`super::SemaphoreNode::inspect_semaphore`]).
    ///
    /// # Errors
    /// A store failure as for [`LockStore::acquire`].
    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>, LockError>;

    /// Describes a semaphore and publishes a watcher's marker in the same
    /// step (see [`super::SemaphoreNode::probe_semaphore`]).
    ///
    /// # Errors
    /// A store failure as for [`LockStore::acquire`].
    async fn probe_semaphore(
        &self,
        name: &LockName,
        marker: &str,
    ) -> Result<crate::lock::semaphore::ProbedSemaphore, LockError>;

    /// One page of the semaphores with a permit held, as
    /// [`LockStore::list_locks`].
    ///
    /// # Errors
    /// As for [`LockStore::list_locks`].
    async fn list_semaphores(
        &self,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<Page<SemaphoreEntry>, LockError>;
}

/// The runs of a store (see [`super::run`]): each call as the
/// [`super::RunNode`] method of the same name says.
#[async_trait]
pub trait RunStore: Send + Sync {
    /// Starts, renews or replays a run (see [`super::RunNode::start_run`]).
    ///
    /// # Errors
    /// A store failure as for [`LockStore::acquire`].
    async fn start_run(
        &self,
        req: &StartRequest,
    ) -> Result<Result<Started, StartRefusal>, LockError>;

    /// Completes a run (see [`super::RunNode::complete_run`]).
    ///
    /// # Errors
    /// A store failure as for [`LockStore::acquire`].
    async fn complete_run(
        &self,
        key: &LockName,
        token: &Token,
        result: &RunResult,
        retention: Duration,
    ) -> Result<Result<Completed, RunMiss>, LockError>;

    /// Abandons a run's attempt (see [`super::RunNode::abandon_run`]).
    ///
    /// # Errors
    /// A store failure as for [`LockStore::acquire`].
    async fn abandon_run(
        &self,
        key: &LockName,
        token: &Token,
        retention: Duration,
    ) -> Result<Result<(), RunMiss>, LockError>;

    /// Extends a run's attempt (see [`super::RunNode::extend_run`]).
    ///
    /// # Errors
    /// A store failure as for [`LockStore::acquire`].
    async fn extend_run(
        &self,
        key: &LockName,
        token: &Token,
        ttl: ExtendTtl,
        retention: Duration,
    ) -> Result<Result<Attempt, RunMiss>, LockError>;

    /// Describes a run (see [`super::RunNode::inspect_run`]).
    ///
    /// # Errors
    /// A store failure as for [`LockStore::acquire`].
    async fn inspect_run(&self, key: &LockName) -> Result<Option<RunInfo>, LockError>;

    /// As [`super::LockNode::probe`], for a run: its state and fence
    /// counter, and a watcher's `marker` published on its change channel
    /// in the same step.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when the node fails.
    async fn probe_run(&self, key: &LockName, marker: &str) -> Result<ProbedRun, LockError>;

    /// One page of the runs kept (running, done or pending) whose keys
    /// start with `prefix`, as [`LockStore::list_locks`].
    ///
    /// # Errors
    /// As for [`LockStore::list_locks`].
    async fn list_runs(
        &self,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<Page<RunEntry>, LockError>;
}

/// The store of one backend (one Redis server, Sentinel's master, a Redis
/// Cluster, or memory): each call goes to that backend as it is.
pub struct Single {
    node: Arc<dyn Backend>,
}

impl Single {
    /// The store of `node` alone.
    pub fn new(node: Arc<dyn Backend>) -> Self {
        Self { node }
    }
}

#[async_trait]
impl Store for Single {
    fn locks(&self) -> &dyn LockStore {
        self
    }

    fn semaphores(&self) -> Result<&dyn SemaphoreStore, LockError> {
        Ok(self)
    }

    fn runs(&self) -> Result<&dyn RunStore, LockError> {
        Ok(self)
    }

    /// Every subject of one backend is told on that backend's one stream.
    fn watchable(&self, _subject: &Subject) -> Result<(), LockError> {
        Ok(())
    }

    async fn ping(&self) -> Result<(), LockError> {
        self.node.ping().await
    }

    async fn history(&self, subject: &Subject) -> Result<Vec<HistoryEntry>, LockError> {
        self.node.history(subject).await
    }

    async fn break_leases(
        &self,
        subject: &Subject,
        fence: Option<u64>,
        by: &str,
    ) -> Result<Vec<BrokenLease>, LockError> {
        self.node.break_leases(subject, fence, by).await
    }

    fn watch_releases(
        &self,
        listener: Arc<dyn ChangeListener>,
        stop: CancellationToken,
    ) -> Option<Arc<dyn WaitInterest>> {
        self.node.watch_releases(listener, stop)
    }
}

#[async_trait]
impl LockStore for Single {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired, LockError> {
        self.node.acquire(req).await
    }

    async fn extend(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Lease, LockError> {
        self.node.extend(name, token, ttl).await
    }

    async fn release(&self, name: &LockName, token: &Token) -> Result<Released, LockError> {
        self.node.release(name, token).await
    }

    async fn release_handing(
        &self,
        name: &LockName,
        token: &Token,
        next: &AcquireRequest,
    ) -> Result<(Released, Option<Result<Acquired, LockError>>), LockError> {
        self.node.release_handing(name, token, next).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        Ok(self.node.holder(name).await?.map(|(_, info)| info))
    }

    async fn probe(&self, name: &LockName, marker: &str) -> Result<ProbedLock, LockError> {
        self.node.probe(name, marker).await
    }

    async fn list_locks(
        &self,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<Page<LockEntry>, LockError> {
        let found = self.node.scan(Kind::Lock, prefix, at, limit).await?;
        let holders = self.node.holders(&found.names).await?;
        // A name freed between the walk and the read is left out.
        let items = found
            .names
            .into_iter()
            .zip(holders)
            .filter_map(|(name, holder)| holder.map(|(_, info)| LockEntry { name, info }))
            .collect();
        Ok(Page {
            items,
            next: found.next,
        })
    }
}

#[async_trait]
impl SemaphoreStore for Single {
    async fn take_permit(
        &self,
        req: &PermitRequest,
    ) -> Result<Result<PermitOutcome, Refusal>, LockError> {
        self.node.take_permit(req).await
    }

    async fn give_back_permit(
        &self,
        name: &LockName,
        token: &Token,
    ) -> Result<Option<Released>, LockError> {
        self.node.give_back_permit(name, token).await
    }

    async fn extend_permit(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Option<Permit>, LockError> {
        self.node.extend_permit(name, token, ttl).await
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>, LockError> {
        self.node.inspect_semaphore(name).await
    }

    async fn probe_semaphore(
        &self,
        name: &LockName,
        marker: &str,
    ) -> Result<crate::lock::semaphore::ProbedSemaphore, LockError> {
        self.node.probe_semaphore(name, marker).await
    }

    async fn list_semaphores(
        &self,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<Page<SemaphoreEntry>, LockError> {
        let found = self.node.scan(Kind::Semaphore, prefix, at, limit).await?;
        let infos = self.node.semaphores(&found.names).await?;
        let items = found
            .names
            .into_iter()
            .zip(infos)
            .filter_map(|(name, info)| info.map(|info| SemaphoreEntry { name, info }))
            .collect();
        Ok(Page {
            items,
            next: found.next,
        })
    }
}

#[async_trait]
impl RunStore for Single {
    async fn start_run(
        &self,
        req: &StartRequest,
    ) -> Result<Result<Started, StartRefusal>, LockError> {
        self.node.start_run(req).await
    }

    async fn complete_run(
        &self,
        key: &LockName,
        token: &Token,
        result: &RunResult,
        retention: Duration,
    ) -> Result<Result<Completed, RunMiss>, LockError> {
        self.node.complete_run(key, token, result, retention).await
    }

    async fn abandon_run(
        &self,
        key: &LockName,
        token: &Token,
        retention: Duration,
    ) -> Result<Result<(), RunMiss>, LockError> {
        self.node.abandon_run(key, token, retention).await
    }

    async fn extend_run(
        &self,
        key: &LockName,
        token: &Token,
        ttl: ExtendTtl,
        retention: Duration,
    ) -> Result<Result<Attempt, RunMiss>, LockError> {
        self.node.extend_run(key, token, ttl, retention).await
    }

    async fn inspect_run(&self, key: &LockName) -> Result<Option<RunInfo>, LockError> {
        self.node.inspect_run(key).await
    }

    async fn probe_run(&self, key: &LockName, marker: &str) -> Result<ProbedRun, LockError> {
        self.node.probe_run(key, marker).await
    }

    async fn list_runs(
        &self,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<Page<RunEntry>, LockError> {
        let found = self.node.scan(Kind::Run, prefix, at, limit).await?;
        let infos = self.node.runs(&found.names).await?;
        // A run forgotten between the walk and the read is left out.
        let items = found
            .names
            .into_iter()
            .zip(infos)
            .filter_map(|(key, info)| info.map(|info| RunEntry { key, info }))
            .collect();
        Ok(Page {
            items,
            next: found.next,
        })
    }
}
