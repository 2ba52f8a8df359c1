//! [`Locks`]: the lock service the HTTP layer calls. It adds waiting to a
//! [`LockBackend`]: a request may wait up to `wait` for a held lock, woken by
//! release events and by the holder's lease running out, never by polling at
//! a fixed interval.
//!
//! # Cancel safety
//! An acquire runs in a task of its own. When the caller goes away (client
//! hung up, request timed out), the task finishes the backend call it is in,
//! and if that call granted the lock, releases it with a compare-and-delete:
//! a lock is never left set for a caller who will not see its token (field
//! case C08). When the backend call itself timed out, its outcome is unknown;
//! for a token lockd generated (nobody else can hold it) the Redis store
//! compare-and-deletes it once the stalled call has surely run or failed
//! (see [`super::redis`]). A client-chosen token is left alone: the client
//! may retry with it, and its retry must not be undone.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::queue::WaitQueues;
use super::{
    AcquireRequest, Acquired, ExtendTtl, Lease, LockBackend, LockError, LockInfo, LockName,
    Released, Token,
};

/// The most random delay added to a retry at the holder's lease end, so that
/// the queue heads of several lockd instances do not all retry at the same
/// instant.
const EXPIRY_JITTER_MS: u64 = 5;

/// Told about every acquire that found its lock held on its first try
/// (whether it then failed at once, waited and got it, or timed out): the
/// measure of contention.
pub type ContentionHook = Arc<dyn Fn(&LockName) + Send + Sync>;

/// Locks with waiting, over one backend.
#[derive(Clone)]
pub struct Locks {
    backend: Arc<dyn LockBackend>,
    queues: Arc<WaitQueues>,
    shutdown: CancellationToken,
    on_contention: Option<ContentionHook>,
}

impl Locks {
    /// The service over `backend`, with at most `max_waiters` requests
    /// waiting at once. Starts the backend's release events, which stop with
    /// `shutdown`; cancelling `shutdown` also ends every wait with
    /// [`LockError::ShuttingDown`].
    pub fn new(
        backend: Arc<dyn LockBackend>,
        max_waiters: usize,
        shutdown: CancellationToken,
    ) -> Self {
        let queues = Arc::new(WaitQueues::new(max_waiters));
        backend.watch_releases(queues.clone(), shutdown.clone());
        Self {
            backend,
            queues,
            shutdown,
            on_contention: None,
        }
    }

    /// Calls `hook` for every acquire that finds its lock held on its first
    /// try.
    #[must_use]
    pub fn on_contention(mut self, hook: ContentionHook) -> Self {
        self.on_contention = Some(hook);
        self
    }

    /// Calls `each(name, waiters)` for every lock that has waiters now.
    pub fn for_each_queue(&self, each: impl FnMut(&str, usize)) {
        self.queues.for_each_queue(each);
    }

    fn contended(&self, name: &LockName) {
        if let Some(hook) = &self.on_contention {
            hook(name);
        }
    }

    /// One acquire try; counts contention when it is the request's first.
    async fn try_acquire(&self, req: &AcquireRequest, first: bool) -> Result<Acquired, LockError> {
        let outcome = self.backend.acquire(req).await;
        if first && matches!(outcome, Err(LockError::Held { .. })) {
            self.contended(&req.name);
        }
        outcome
    }

    /// Takes the lock, waiting up to `wait` while another holder has it.
    /// With `wait` zero the request fails at once and is never queued, so it
    /// can take a free lock ahead of the queue.
    ///
    /// # Errors
    /// [`LockError::Held`] when `wait` is zero and the lock is held;
    /// [`LockError::WaitTimedOut`] when the wait ran out;
    /// [`LockError::TooManyWaiters`] when the lock is held and the queue is
    /// full; [`LockError::ShuttingDown`] when the service stops during the
    /// wait; [`LockError::Unavailable`] or [`LockError::Backend`] when the
    /// backend fails.
    pub async fn acquire(
        &self,
        req: AcquireRequest,
        wait: Duration,
    ) -> Result<Acquired, LockError> {
        let req = Arc::new(req);
        let caller_gone = CancellationToken::new();
        let _hang_up = caller_gone.clone().drop_guard();
        let (answer, outcome) = oneshot::channel();
        let (this, task_req) = (self.clone(), req.clone());
        tokio::spawn(async move {
            let result = this.acquire_or_wait(&task_req, wait, &caller_gone).await;
            if let Err(Ok(Acquired::Granted(_))) = answer.send(result) {
                this.release_orphan(&task_req).await;
            }
        });
        let mut pending = Pending {
            outcome,
            locks: self.clone(),
            req,
        };
        (&mut pending.outcome)
            .await
            .unwrap_or_else(|_| Err(LockError::Unavailable("acquire task ended".into())))
    }

    /// Releases a lock granted to a caller who went away.
    async fn release_orphan(&self, req: &AcquireRequest) {
        match self.release(&req.name, &req.token).await {
            Ok(_) => {
                tracing::info!(lock = %req.name, "released a lock granted after its caller left");
            }
            Err(e) => tracing::warn!(
                lock = %req.name,
                error = %e,
                "could not release a lock granted after its caller left; it runs out with its TTL"
            ),
        }
    }

    async fn acquire_or_wait(
        &self,
        req: &AcquireRequest,
        wait: Duration,
        caller_gone: &CancellationToken,
    ) -> Result<Acquired, LockError> {
        if wait.is_zero() {
            return self.try_acquire(req, true).await;
        }
        let deadline = Instant::now() + wait;
        // Join before the first attempt, so a release between a failed
        // attempt and the wait cannot be missed, and so that a newcomer does
        // not overtake the waiters already queued.
        let Ok(place) = self.queues.join(&req.name) else {
            // No room to wait: a free lock is still granted.
            return match self.try_acquire(req, true).await {
                Err(LockError::Held { .. }) => Err(LockError::TooManyWaiters),
                other => other,
            };
        };
        let mut retry_at = Instant::now();
        // Others waiting already means the lock is held: contention.
        let mut first = place.is_head();
        if !first {
            self.contended(&req.name);
        }
        loop {
            if place.is_head() {
                let outcome = self.try_acquire(req, first).await;
                first = false;
                match outcome {
                    Err(LockError::Held { retry_after }) => {
                        let lease_end = Instant::now() + retry_after;
                        place.note_lease_end(lease_end);
                        retry_at = lease_end + jitter();
                    }
                    other => return other,
                }
            }
            let head = place.is_head();
            // Biased, in this order: once shutdown began, or the caller left,
            // a waiter must not try Redis again, even when its wake-up (the
            // waiter ahead of it leaving) is ready at the same moment.
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return Err(LockError::ShuttingDown),
                () = caller_gone.cancelled() => {
                    return Err(LockError::Unavailable("the caller went away".into()));
                }
                () = place.woken() => {}
                () = sleep_until(retry_at), if head => {}
                () = sleep_until(deadline) => {
                    // The lock may have freed without an event (a foreign
                    // client deleted it): the head looks once more.
                    if place.is_head() {
                        let outcome = self.try_acquire(req, first).await;
                        match outcome {
                            Err(LockError::Held { retry_after }) => {
                                place.note_lease_end(Instant::now() + retry_after);
                            }
                            other => return other,
                        }
                    }
                    let lease_end = place.lease_end().unwrap_or(retry_at);
                    let retry_after = lease_end.saturating_duration_since(Instant::now());
                    return Err(LockError::WaitTimedOut {
                        retry_after: retry_after.max(Duration::from_millis(1)),
                    });
                }
            }
        }
    }

    /// See [`LockBackend::extend`].
    ///
    /// # Errors
    /// As for [`LockBackend::extend`].
    pub async fn extend(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Lease, LockError> {
        self.backend.extend(name, token, ttl).await
    }

    /// See [`LockBackend::release`].
    ///
    /// # Errors
    /// As for [`LockBackend::release`].
    pub async fn release(&self, name: &LockName, token: &Token) -> Result<Released, LockError> {
        self.backend.release(name, token).await
    }

    /// See [`LockBackend::inspect`].
    ///
    /// # Errors
    /// As for [`LockBackend::inspect`].
    pub async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.backend.inspect(name).await
    }

    /// See [`LockBackend::ping`].
    ///
    /// # Errors
    /// As for [`LockBackend::ping`].
    pub async fn ping(&self) -> Result<(), LockError> {
        self.backend.ping().await
    }
}

/// The caller's end of an acquire. If the caller goes away after the task
/// sent a grant but before it was read, the grant is released here.
struct Pending {
    outcome: oneshot::Receiver<Result<Acquired, LockError>>,
    locks: Locks,
    req: Arc<AcquireRequest>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Ok(Ok(Acquired::Granted(_))) = self.outcome.try_recv() {
            let (locks, req) = (self.locks.clone(), self.req.clone());
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { locks.release_orphan(&req).await });
            }
        }
    }
}

fn jitter() -> Duration {
    Duration::from_millis(rand::random_range(0..=EXPIRY_JITTER_MS))
}
