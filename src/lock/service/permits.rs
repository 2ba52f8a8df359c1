//! Semaphores on [`Locks`]: a permit is taken as a lock is acquired, with
//! the same waiting and the same cancel safety. A request that finds the
//! semaphore full may wait up to `wait` in the semaphore's queue on this
//! instance (first come, first served), woken by a permit given back or
//! extended (release events, from any instance) and by the earliest
//! permit's lease end. A caller who goes away mid-wait takes nothing, and
//! a permit granted after it left is given back (see [`super::Attached`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Attached, Locks, Looked, Orphan, Tried, Waited};
use crate::lock::reaper::{Attempt, Reap, Reaped};
use crate::lock::semaphore::{Permit, PermitOutcome, PermitRequest, Refusal, SemaphoreInfo};
use crate::lock::{
    ExtendTtl, LeaseLeft, LockError, LockName, Released, SemaphoreStore, Subject, Token,
};

/// The most semaphores [`Known`] remembers.
const MAX_KNOWN: usize = 1_000;

/// The semaphores this instance granted permits of (or the locks it
/// granted shared leases of), up to [`MAX_KNOWN`], for the permits-held
/// (shared-holders) gauge: each is read from the store at scrape time, and
/// forgotten once it has no permit (shared lease) left.
#[derive(Default)]
pub(super) struct Known(Mutex<HashSet<LockName>>);

impl Known {
    pub(super) fn names(&self) -> MutexGuard<'_, HashSet<LockName>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers `name`, while there is room.
    pub(super) fn remember(&self, name: &LockName) {
        let mut known = self.names();
        if known.len() < MAX_KNOWN {
            known.insert(name.clone());
        }
    }

    /// Each remembered name with what `count` reads of it from the store
    /// (each read bounded by `timeout`): the names it finds held, with
    /// their count; those it finds with none (`Ok(None)`) are forgotten,
    /// those whose read fails are left out and kept.
    pub(super) async fn counts<F, Fut>(&self, timeout: Duration, count: F) -> Vec<(String, usize)>
    where
        F: Fn(LockName) -> Fut,
        Fut: std::future::Future<Output = Result<Option<usize>, LockError>>,
    {
        let names: Vec<LockName> = self.names().iter().cloned().collect();
        let reads = names.into_iter().map(|name| {
            let read = count(name.clone());
            async move { (name, tokio::time::timeout(timeout, read).await) }
        });
        let mut held = Vec::new();
        let mut gone = Vec::new();
        for (name, read) in futures_util::future::join_all(reads).await {
            match read {
                Ok(Ok(Some(n))) => held.push((name.as_str().to_owned(), n)),
                Ok(Ok(None)) => gone.push(name),
                _ => {}
            }
        }
        let mut known = self.names();
        for name in &gone {
            known.remove(name);
        }
        held
    }
}

/// A permit request's [`Orphan`]: gives back a new permit.
struct PermitOrphan {
    locks: Locks,
    req: Arc<PermitRequest>,
}

impl Orphan<Result<PermitOutcome, Refusal>> for PermitOrphan {
    async fn undo(self, outcome: Result<Result<PermitOutcome, Refusal>, LockError>) {
        // Only under a token lockd generated (see `LockOrphan`).
        if let Ok(Ok(PermitOutcome::Granted(_))) = outcome
            && self.req.token_generated
        {
            self.locks.give_back_orphan(&self.req).await;
        }
    }
}

impl Locks {
    /// Takes one permit of `req.name`, or renews the one `req.token`
    /// holds, waiting up to `wait` while the semaphore is full. With `wait`
    /// zero it is refused at once and never queued. The inner `Err` is the
    /// refusal: [`Refusal::Full`] (after the wait, with when the earliest
    /// permit runs out), or [`Refusal::LimitMismatch`] at once.
    ///
    /// # Errors
    /// As for [`Locks::acquire`]: [`LockError::TooManyWaiters`],
    /// [`LockError::ShuttingDown`], a store failure, and
    /// [`LockError::Unsupported`] from a store without semaphores.
    pub async fn take_permit(
        &self,
        req: PermitRequest,
        wait: Duration,
    ) -> Result<Result<PermitOutcome, Refusal>, LockError> {
        let req = Arc::new(req);
        let caller_gone = (!wait.is_zero()).then(CancellationToken::new);
        let (this, op_req, told) = (self.clone(), req.clone(), caller_gone.clone());
        let op = Box::pin(async move { this.take_or_wait(&op_req, wait, told.as_ref()).await });
        let orphan = PermitOrphan {
            locks: self.clone(),
            req: req.clone(),
        };
        let outcome = Attached::new(op, caller_gone, orphan).await;
        if let Ok(Ok(PermitOutcome::Granted(_))) = &outcome {
            let mut known = self.known.names();
            if known.len() < MAX_KNOWN {
                known.insert(req.name.clone());
            }
        }
        outcome
    }

    /// How many live permits each semaphore this instance granted permits
    /// of has now, by every instance's holders, read from the store (each
    /// read bounded by `timeout`; one that fails is left out). A semaphore
    /// with none left is forgotten.
    pub async fn permits_held(&self, timeout: Duration) -> Vec<(String, usize)> {
        let Ok(store) = self.store.semaphores() else {
            return Vec::new();
        };
        self.known
            .counts(timeout, |name| async move {
                let info = store.inspect_semaphore(&name).await?;
                Ok(info.map(|info| info.permits.len()))
            })
            .await
    }

    async fn take_or_wait(
        &self,
        req: &PermitRequest,
        wait: Duration,
        caller_gone: Option<&CancellationToken>,
    ) -> Result<Result<PermitOutcome, Refusal>, LockError> {
        let store = self.store.semaphores()?;
        if wait.is_zero() {
            return store.take_permit(req).await;
        }
        let waited = self
            .wait_turn(
                &Subject::semaphore(req.name.clone()),
                wait,
                caller_gone,
                || {},
                || async {
                    match store.take_permit(req).await {
                        Ok(Err(refusal @ Refusal::Full { retry_after, .. })) => Tried::Busy {
                            left: LeaseLeft::AtMost(retry_after),
                            refusal,
                        },
                        other => Tried::Ended(other),
                    }
                },
                || look_at_semaphore(store, &req.name),
                || answer_behind_others(store, req),
                None,
                false,
            )
            .await?;
        match waited {
            Waited::Ended(outcome) => outcome,
            Waited::TimedOut { left, refusal } => {
                let limit = match refusal {
                    Some(Refusal::Full { limit, .. }) => limit,
                    _ => req.limit,
                };
                // A permit's lease always ends (its score is its end).
                let retry_after = left.retry_after();
                Ok(Err(Refusal::Full { retry_after, limit }))
            }
        }
    }

    /// Gives back a permit granted to a caller who went away: one attempt
    /// of the [`Reaper`](crate::lock::reaper).
    async fn give_back_orphan(&self, req: &PermitRequest) {
        let reap = Reap::at_once(Duration::ZERO);
        let Ok(store) = self.store.semaphores() else {
            return;
        };
        let outcome = reap
            .run(None, || async {
                match store.give_back_permit(&req.name, &req.token).await {
                    Ok(_) => Attempt::Done,
                    Err(e) => Attempt::Retry(e),
                }
            })
            .await;
        match outcome {
            Reaped::Done => {
                tracing::info!(semaphore = %req.name, "gave back a permit granted after its caller left");
            }
            Reaped::GaveUp(e) => tracing::warn!(
                semaphore = %req.name,
                error = %e,
                "could not give back a permit granted after its caller left; it runs out with its TTL"
            ),
            Reaped::Stopped => {}
        }
    }

    /// Gives back the permit `token` holds: when it was granted, or `None`
    /// when it holds none (given back already, or run out).
    ///
    /// # Errors
    /// A store failure, or [`LockError::Unsupported`].
    pub async fn give_back_permit(
        &self,
        name: &LockName,
        token: &Token,
    ) -> Result<Option<Released>, LockError> {
        self.store.semaphores()?.give_back_permit(name, token).await
    }

    /// Resets the lease of the permit `token` holds to `ttl`; `None` when
    /// it holds none. Never creates a permit.
    ///
    /// # Errors
    /// As for [`Locks::give_back_permit`].
    pub async fn extend_permit(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Option<Permit>, LockError> {
        self.store
            .semaphores()?
            .extend_permit(name, token, ttl)
            .await
    }

    /// The semaphore's limit and live permits (never a token), or `None`
    /// when no permit is held.
    ///
    /// # Errors
    /// As for [`Locks::give_back_permit`].
    pub async fn inspect_semaphore(
        &self,
        name: &LockName,
    ) -> Result<Option<SemaphoreInfo>, LockError> {
        self.store.semaphores()?.inspect_semaphore(name).await
    }
}

/// For a permit request queued behind other waiters: a limit other
/// than the one held is refused at once (waiting would not change it),
/// and a token (one the client chose) that holds a permit renews it at
/// once (an extend to the requested TTL, keeping the fence), as at the
/// head of the queue; otherwise it waits its turn. Nothing is taken
/// ahead of the queue.
async fn answer_behind_others(
    store: &dyn SemaphoreStore,
    req: &PermitRequest,
) -> Option<Result<Result<PermitOutcome, Refusal>, LockError>> {
    if let Ok(Some(info)) = store.inspect_semaphore(&req.name).await
        && info.limit != req.limit
    {
        return Some(Ok(Err(Refusal::LimitMismatch { held: info.limit })));
    }
    if req.token_generated {
        return None;
    }
    match store
        .extend_permit(&req.name, &req.token, ExtendTtl::To(req.ttl))
        .await
    {
        Ok(Some(permit)) if permit.limit == req.limit => {
            Some(Ok(Ok(PermitOutcome::Renewed(permit))))
        }
        _ => None,
    }
}

/// Whether semaphore `name` has a free permit, for a waiter woken to
/// look (see `Locks::wait_turn`).
async fn look_at_semaphore(store: &dyn SemaphoreStore, name: &LockName) -> Looked {
    match store.inspect_semaphore(name).await {
        Ok(None) => Looked::Free,
        Ok(Some(info)) if info.permits.len() < info.limit.get() as usize => Looked::Free,
        Ok(Some(info)) => info
            .permits
            .iter()
            .map(|p| p.remaining)
            .min()
            .map_or(Looked::Unknown, Looked::HeldFor),
        Err(_) => Looked::Unknown,
    }
}
