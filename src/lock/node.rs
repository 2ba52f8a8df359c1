//! The traits of one lock server, one per kind of lease: a backend is a
//! [`Node`] (what every server does: answer a ping, list its keys, tell of
//! changes) that keeps locks ([`LockNode`]) and semaphores
//! ([`SemaphoreNode`]) and runs ([`RunNode`]); [`Backend`] is all three, what [`super::Single`] wraps.
//! Redlock needs locks only, so it takes [`LockNode`]s. A trait per kind,
//! rather than one trait with a default "unsupported" body per method: a
//! backend either keeps a kind or is not used for it, and the compiler says
//! which, so no call can reach a method the backend never wrote. A new kind
//! of lease adds its own trait here, and [`Backend`] grows by one bound.
//!
//! [`ChangeListener`] and [`WaitInterest`] are how a node's change stream
//! reaches the service, and how the service tells a node what it waits for.

use crate::lock::ProbedLock;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::Kind;
use super::history::{BrokenLease, HistoryEntry};
use super::listing::{NamePrefix, PageSize, Position, ScanPage};
use super::run::ProbedRun;
use super::run::{
    Attempt, Completed, RunInfo, RunMiss, RunResult, StartRefusal, StartRequest, Started,
};
use super::semaphore::{Permit, PermitOutcome, PermitRequest, Refusal, SemaphoreInfo};
use super::{
    AcquireRequest, Acquired, Change, ExtendTtl, Lease, LockError, LockInfo, LockName, Released,
    Subject, Token,
};

/// One lock server: a single Redis, or the in-process memory store. What
/// it does whatever kinds of lease it keeps. Its primitives work on that
/// server alone; a [`super::Store`] makes them a lock store (one node as it
/// is, or several through [`super::redlock`]).
#[async_trait]
pub trait Node: Send + Sync + 'static {
    /// One step of a walk of this node's held locks (or semaphores) whose
    /// names start with `prefix`, from `at` (see [`super::listing`]): at most
    /// `limit` names that may be held, and where the walk goes on. Its cost
    /// is bounded by `limit`, not by the number of keys: the names may be
    /// fewer, even none, with the walk not over.
    ///
    /// # Errors
    /// [`LockError::BadCursor`] when `at` is not a position of this node;
    /// [`LockError::Unavailable`] or [`LockError::Backend`] when the node
    /// fails.
    async fn scan(
        &self,
        kind: Kind,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<ScanPage, LockError>;

    /// Whether this node's grants may count toward a Redlock quorum now:
    /// false while a Redis node is in its delayed restart (see `redis::restart`).
    fn counts_for_quorum(&self) -> bool {
        true
    }

    /// Checks that the node answers, for `/readyz`.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when it does not.
    async fn ping(&self) -> Result<(), LockError>;

    /// The history of `subject` on this node (see [`super::history`]):
    /// its last leases, newest first, each open one settled against the
    /// fences that hold `subject` at the moment of the read (in the same
    /// atomic step). Empty when none is kept (none granted, past the
    /// fence retention, or `--history-length 0`).
    ///
    /// # Errors
    /// [`LockError::Unavailable`] or [`LockError::Backend`] when the node
    /// fails.
    async fn history(&self, subject: &Subject) -> Result<Vec<HistoryEntry>, LockError>;

    /// Ends the live leases of `subject` whatever their token: every one,
    /// or the one whose fence is `fence`; tells each end as
    /// [`Change::Broken`] (waiters wake, watchers hear it) and records it
    /// in the history as broken by `by`. A lock's next grant gets a larger
    /// fence, as after any end. A run's attempt ends as an abandonment
    /// would: the run is pending, nothing stored. Returns the leases
    /// ended, none when nothing matched.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] or [`LockError::Backend`] when the node
    /// fails (some leases may have been ended).
    async fn break_leases(
        &self,
        subject: &Subject,
        fence: Option<u64>,
        by: &str,
    ) -> Result<Vec<BrokenLease>, LockError>;

    /// Starts telling `listener` about releases and extends of locks, by
    /// any client of the same node, until `stop` is cancelled. A node that
    /// hears every change at once returns `None`; one that subscribes
    /// subject by subject (Redis: `SUBSCRIBE`, or sharded pub/sub on a
    /// Cluster) returns the [`WaitInterest`] to tell which subjects are
    /// waited for, and hears the changes of those only. The default does nothing and
    /// returns `None`: waiters then wake only when the holder's lease runs
    /// out.
    fn watch_releases(
        &self,
        listener: Arc<dyn ChangeListener>,
        stop: CancellationToken,
    ) -> Option<Arc<dyn WaitInterest>> {
        let _ = (listener, stop);
        None
    }
}

/// The lock primitives of one server. `holder` gives the holder's token,
/// for Redlock, which compares holders across nodes: no
/// [`super::Store`] method hands a token back, so a token never reaches a
/// client from a node.
#[async_trait]
pub trait LockNode: Node {
    /// Takes the lock if it is free, or renews it if `req.token` already
    /// holds it.
    ///
    /// # Errors
    /// [`LockError::Held`] with the holder's remaining lease when another
    /// token holds it; [`LockError::Unavailable`] when the node fails.
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired, LockError>;

    /// Resets the lease of a lock held by `token` to `ttl` (the given one,
    /// or the lock's own). Never creates a lock.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] when nobody holds it, [`LockError::NotOwner`]
    /// when another token does, [`LockError::Unavailable`] when the node
    /// fails.
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
    /// As for [`LockNode::extend`].
    async fn release(&self, name: &LockName, token: &Token) -> Result<Released, LockError>;

    /// Releases a lock held by `token`, as [`LockNode::release`], and
    /// when that freed it (an exclusive holder's release), may try `next`
    /// (the head waiter's acquire) after it: the release's answer, and the
    /// try's (`None` when none was made). Redis does both in one step, so
    /// that a handoff costs one round trip, and makes no try when another
    /// instance listens to the lock's changes (it may have waiters of its
    /// own); this default, for a node no other instance shares (memory),
    /// makes the two calls.
    ///
    /// # Errors
    /// As for [`LockNode::release`]; the try's failure is in its answer.
    async fn release_handing(
        &self,
        name: &LockName,
        token: &Token,
        next: &AcquireRequest,
    ) -> Result<(Released, Option<Result<Acquired, LockError>>), LockError> {
        let released = self.release(name, token).await?;
        let tried = match released.mode {
            super::Mode::Exclusive => Some(self.acquire(next).await),
            super::Mode::Shared => None,
        };
        Ok((released, tried))
    }

    /// The current holder's token and description, or `None` when the lock
    /// is free.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when the node fails.
    async fn holder(&self, name: &LockName) -> Result<Option<(Token, LockInfo)>, LockError>;

    /// The holders of `names`, in their order (`None` for a free one), read
    /// together: by default one [`LockNode::holder`] after another.
    ///
    /// # Errors
    /// As for [`LockNode::holder`].
    async fn holders(
        &self,
        names: &[LockName],
    ) -> Result<Vec<Option<(Token, LockInfo)>>, LockError> {
        let mut found = Vec::with_capacity(names.len());
        for name in names {
            found.push(self.holder(name).await?);
        }
        Ok(found)
    }

    /// Describes the holder as [`super::LockStore::inspect`] does, with the
    /// lock's fence counter ([`ProbedLock`]), and, in the same atomic step,
    /// publishes [`Change::Probe`]`(marker)` on the lock's change channel: the watcher that hears its marker knows that every
    /// change before the read has reached it (see `service::watch`).
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when the node fails;
    async fn probe(&self, name: &LockName, marker: &str) -> Result<ProbedLock, LockError>;

    /// Raises the fencing counter of `name` to at least `fence`, and if
    /// `token` holds the lock, records `fence` as the holder's. Returns
    /// whether `token` held it. Redlock uses this after a grant whose nodes
    /// disagree (see [`super::redlock`]).
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when the node fails.
    async fn raise_fence(
        &self,
        name: &LockName,
        token: &Token,
        fence: u64,
    ) -> Result<bool, LockError>;
}

/// The semaphore primitives of one server (see [`super::semaphore`]).
#[async_trait]
pub trait SemaphoreNode: Node {
    /// Takes one permit of semaphore `req.name`, or renews the one
    /// `req.token` holds (see [`super::semaphore`]). The inner `Err` is a refusal:
    /// the semaphore is full, or held under another limit.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] or [`LockError::Backend`] when the node
    /// fails (the permit may or may not have been granted).
    async fn take_permit(
        &self,
        req: &PermitRequest,
    ) -> Result<Result<PermitOutcome, Refusal>, LockError>;

    /// Gives back the permit `token` holds: `None` when it holds none
    /// (given back already, or run out), else when it was granted.
    ///
    /// # Errors
    /// As for [`SemaphoreNode::take_permit`].
    async fn give_back_permit(
        &self,
        name: &LockName,
        token: &Token,
    ) -> Result<Option<Released>, LockError>;

    /// Resets the lease of the permit `token` holds to `ttl`; `None` when
    /// it holds none. Never creates a permit.
    ///
    /// # Errors
    /// As for [`SemaphoreNode::take_permit`].
    async fn extend_permit(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Option<Permit>, LockError>;

    /// The semaphore's limit and live permits (never a token), or `None`
    /// when no permit is held.
    ///
    /// # Errors
    /// As for [`SemaphoreNode::take_permit`].
    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>, LockError>;

    /// The semaphores `names`, in their order (`None` for one with no
    /// permit held), read together: by default one
    /// [`SemaphoreNode::inspect_semaphore`] after another.
    ///
    /// # Errors
    /// As for [`SemaphoreNode::inspect_semaphore`].
    async fn semaphores(
        &self,
        names: &[LockName],
    ) -> Result<Vec<Option<SemaphoreInfo>>, LockError> {
        let mut found = Vec::with_capacity(names.len());
        for name in names {
            found.push(self.inspect_semaphore(name).await?);
        }
        Ok(found)
    }

    /// As [`LockNode::probe`], for a semaphore: [`SemaphoreNode::inspect_semaphore`] and
    /// the marker in one step.
    ///
    /// # Errors
    /// As for [`LockNode::probe`].
    async fn probe_semaphore(
        &self,
        name: &LockName,
        marker: &str,
    ) -> Result<crate::lock::semaphore::ProbedSemaphore, LockError>;
}

/// The run primitives of one server (see [`super::run`]). A run's keys
/// share one hash slot, so each call is one atomic script on one node.
#[async_trait]
pub trait RunNode: Node {
    /// Starts an attempt of run `req.key`, renews the one `req.token`
    /// holds, or answers the result of a done run. The inner `Err` is a
    /// refusal: another attempt holds it, or another fingerprint started it
    /// (nothing is changed then).
    ///
    /// # Errors
    /// [`LockError::Unavailable`] or [`LockError::Backend`] when the node
    /// fails (the attempt may or may not have started).
    async fn start_run(
        &self,
        req: &StartRequest,
    ) -> Result<Result<Started, StartRefusal>, LockError>;

    /// Completes the run whose live attempt `token` holds: stores `result`
    /// for `retention` and ends the attempt. When `token` completed the run
    /// already (a retry after a lost answer), answers the stored run
    /// unchanged.
    ///
    /// # Errors
    /// As for [`RunNode::start_run`].
    async fn complete_run(
        &self,
        key: &LockName,
        token: &Token,
        result: &RunResult,
        retention: Duration,
    ) -> Result<Result<Completed, RunMiss>, LockError>;

    /// Abandons the attempt `token` holds: the run is pending again and
    /// nothing is stored; its record (attempt count, fingerprint) is kept
    /// for `retention`.
    ///
    /// # Errors
    /// As for [`RunNode::start_run`].
    async fn abandon_run(
        &self,
        key: &LockName,
        token: &Token,
        retention: Duration,
    ) -> Result<Result<(), RunMiss>, LockError>;

    /// Resets the lease of the attempt `token` holds to `ttl`, the record
    /// kept for `retention` after it. Never starts an attempt.
    ///
    /// # Errors
    /// As for [`RunNode::start_run`].
    async fn extend_run(
        &self,
        key: &LockName,
        token: &Token,
        ttl: ExtendTtl,
        retention: Duration,
    ) -> Result<Result<Attempt, RunMiss>, LockError>;

    /// The run's state (never a token), or `None` when it is unknown.
    ///
    /// # Errors
    /// As for [`RunNode::start_run`].
    async fn inspect_run(&self, key: &LockName) -> Result<Option<RunInfo>, LockError>;

    /// As [`super::LockNode::probe`], for a run: its state and fence
    /// counter, and a watcher's `marker` published on its change channel
    /// in the same step.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when the node fails.
    async fn probe_run(&self, key: &LockName, marker: &str) -> Result<ProbedRun, LockError>;

    /// The runs `keys`, in their order (`None` for an unknown one), read
    /// together: by default one [`RunNode::inspect_run`] after another.
    ///
    /// # Errors
    /// As for [`RunNode::inspect_run`].
    async fn runs(&self, keys: &[LockName]) -> Result<Vec<Option<RunInfo>>, LockError> {
        let mut found = Vec::with_capacity(keys.len());
        for key in keys {
            found.push(self.inspect_run(key).await?);
        }
        Ok(found)
    }
}

/// A server that keeps every kind of lease: what a [`super::Single`]
/// store serves. Implemented for every type that implements each kind's
/// trait.
pub trait Backend: LockNode + SemaphoreNode + RunNode {}

impl<T: LockNode + SemaphoreNode + RunNode> Backend for T {}

/// Receives change events from a backend.
pub trait ChangeListener: Send + Sync + 'static {
    /// `subject` changed as `change` says, on its node. Messages of one
    /// subject arrive in the order of the changes.
    fn changed(&self, subject: &Subject, change: &Change);
    /// Events may have been missed (the event connection was lost and is
    /// back): every waiter that retries should retry now.
    fn resync(&self);
    /// A subscription to `subject`'s changes was made or made again (on a
    /// Redis Cluster, subject by subject): a release just before it may
    /// have been missed, so the waiter that retries should look whether it
    /// is still held, without taking it while the store may be failing
    /// over, and retry if it is free.
    fn subscribed(&self, subject: &Subject);
}

/// Told which subjects this lockd instance waits for, by a store that
/// subscribes to change events subject by subject (see
/// [`Node::watch_releases`]). The wait queues call it in order, while they
/// hold their own lock: an implementation must not block (it queues the
/// change for a task of its own).
pub trait WaitInterest: Send + Sync + 'static {
    /// A waiter found `subject` held and waits for its release: subscribe.
    fn waiting(&self, subject: &Subject);
    /// Nobody waits for `subject` on this instance any more: unsubscribe.
    fn idle(&self, subject: &Subject);
}
