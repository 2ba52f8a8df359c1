//! Runs on [`Locks`]: a start is waited for as a lock's acquire is, in the
//! run's own queue (first come, first served), woken by the attempt's
//! completion or abandonment (change events, from any instance) and by its
//! lease end. A waiter then gets the result of a done run, or a new
//! attempt of an abandoned or lapsed one. A caller who goes away mid-wait
//! takes nothing: an attempt started after it left is abandoned (see
//! [`super::Attached`]).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Attached, Locks, Looked, Orphan, Tried, Waited};
use crate::lock::reaper::{Attempt as Try, Reap, Reaped};
use crate::lock::run::{
    Attempt, Completed, RunInfo, RunMiss, RunResult, StartRefusal, StartRequest, Started,
};
use crate::lock::{ExtendTtl, LockError, LockName, RunStore, Subject, Token};

/// A start's [`Orphan`]: abandons a new attempt.
struct AttemptOrphan {
    locks: Locks,
    req: Arc<StartRequest>,
}

impl Orphan<Result<Started, StartRefusal>> for AttemptOrphan {
    async fn undo(self, outcome: Result<Result<Started, StartRefusal>, LockError>) {
        // Only under a token lockd generated (see `LockOrphan`).
        if let Ok(Ok(Started::New { .. })) = outcome
            && self.req.token_generated
        {
            self.locks.abandon_orphan(&self.req).await;
        }
    }
}

impl Locks {
    /// Starts an attempt of run `req.key`, renews the one `req.token`
    /// holds, or answers the result of a done run, waiting up to `wait`
    /// while another attempt holds it. With `wait` zero an attempt in
    /// progress is refused at once and never queued. The inner `Err` is
    /// the refusal: [`StartRefusal::InProgress`] (after the wait, with
    /// what is left of the live attempt's lease), or
    /// [`StartRefusal::FingerprintMismatch`] at once.
    ///
    /// # Errors
    /// As for [`Locks::acquire`]: [`LockError::TooManyWaiters`],
    /// [`LockError::ShuttingDown`], a store failure, and
    /// [`LockError::Unsupported`] from a store without runs.
    pub async fn start_run(
        &self,
        req: StartRequest,
        wait: Duration,
    ) -> Result<Result<Started, StartRefusal>, LockError> {
        let req = Arc::new(req);
        let caller_gone = (!wait.is_zero()).then(CancellationToken::new);
        let (this, op_req, told) = (self.clone(), req.clone(), caller_gone.clone());
        let op = Box::pin(async move { this.start_or_wait(&op_req, wait, told.as_ref()).await });
        let orphan = AttemptOrphan {
            locks: self.clone(),
            req,
        };
        Attached::new(op, caller_gone, orphan).await
    }

    async fn start_or_wait(
        &self,
        req: &StartRequest,
        wait: Duration,
        caller_gone: Option<&CancellationToken>,
    ) -> Result<Result<Started, StartRefusal>, LockError> {
        let store = self.store.runs()?;
        if wait.is_zero() {
            return store.start_run(req).await;
        }
        let waited = self
            .wait_turn(
                &Subject::run(req.key.clone()),
                wait,
                caller_gone,
                || {},
                || async {
                    match store.start_run(req).await {
                        Ok(Err(refusal @ StartRefusal::InProgress { left, .. })) => {
                            Tried::Busy { left, refusal }
                        }
                        // Only under a token lockd generated (see
                        // `Locks::acquire_or_wait`).
                        Ok(Ok(Started::New { attempt, took_over })) if req.token_generated => {
                            let (held, fence) =
                                (attempt.lease.ttl.as_duration(), attempt.lease.fence);
                            Tried::Holds(Ok(Ok(Started::New { attempt, took_over })), held, fence)
                        }
                        other => Tried::Ended(other),
                    }
                },
                || look_at_run(store, &req.key),
                || renew_behind_others(store, req),
                None,
                false,
            )
            .await?;
        match waited {
            Waited::Ended(outcome) => outcome,
            Waited::TimedOut { left, .. } => {
                Ok(Err(StartRefusal::InProgress { left, waited: true }))
            }
        }
    }

    /// Abandons an attempt started for a caller who went away: one attempt
    /// of the [`Reaper`](crate::lock::reaper).
    async fn abandon_orphan(&self, req: &StartRequest) {
        let Ok(store) = self.store.runs() else {
            return;
        };
        let outcome = Reap::at_once(Duration::ZERO)
            .run(None, || async {
                match store.abandon_run(&req.key, &req.token, req.retention).await {
                    Ok(_) => Try::Done,
                    Err(e) => Try::Retry(e),
                }
            })
            .await;
        match outcome {
            Reaped::Done => {
                tracing::info!(run = %req.key, "abandoned a run's attempt started after its caller left");
            }
            Reaped::GaveUp(e) => tracing::warn!(
                run = %req.key,
                error = %e,
                "could not abandon a run's attempt started after its caller left; it runs out with its TTL"
            ),
            Reaped::Stopped => {}
        }
    }

    /// Completes the run whose live attempt `token` holds, keeping
    /// `result` for `retention` (see [`RunStore::complete_run`]).
    ///
    /// # Errors
    /// A store failure, or [`LockError::Unsupported`].
    pub async fn complete_run(
        &self,
        key: &LockName,
        token: &Token,
        result: &RunResult,
        retention: Duration,
    ) -> Result<Result<Completed, RunMiss>, LockError> {
        self.store
            .runs()?
            .complete_run(key, token, result, retention)
            .await
    }

    /// Abandons the attempt `token` holds (see [`RunStore::abandon_run`]).
    ///
    /// # Errors
    /// As for [`Locks::complete_run`].
    pub async fn abandon_run(
        &self,
        key: &LockName,
        token: &Token,
        retention: Duration,
    ) -> Result<Result<(), RunMiss>, LockError> {
        self.store.runs()?.abandon_run(key, token, retention).await
    }

    /// Resets the lease of the attempt `token` holds (see
    /// [`RunStore::extend_run`]).
    ///
    /// # Errors
    /// As for [`Locks::complete_run`].
    pub async fn extend_run(
        &self,
        key: &LockName,
        token: &Token,
        ttl: ExtendTtl,
        retention: Duration,
    ) -> Result<Result<Attempt, RunMiss>, LockError> {
        self.store
            .runs()?
            .extend_run(key, token, ttl, retention)
            .await
    }

    /// The run's state, or `None` when it is unknown.
    ///
    /// # Errors
    /// As for [`Locks::complete_run`].
    pub async fn inspect_run(&self, key: &LockName) -> Result<Option<RunInfo>, LockError> {
        self.store.runs()?.inspect_run(key).await
    }
}

/// For a start queued behind other waiters: a token (one the client
/// chose) that holds the live attempt renews it at once, as at the head of
/// the queue; otherwise it waits its turn. Nothing is started ahead of
/// the queue.
async fn renew_behind_others(
    store: &dyn RunStore,
    req: &StartRequest,
) -> Option<Result<Result<Started, StartRefusal>, LockError>> {
    if req.token_generated {
        return None;
    }
    match store
        .extend_run(&req.key, &req.token, ExtendTtl::To(req.ttl), req.retention)
        .await
    {
        Ok(Ok(attempt)) => Some(Ok(Ok(Started::Renewed(attempt)))),
        _ => None,
    }
}

/// Whether run `key` may be started (or answered) now, for a waiter woken
/// to look (see `Locks::wait_turn`).
async fn look_at_run(store: &dyn RunStore, key: &LockName) -> Looked {
    match store.inspect_run(key).await {
        Ok(Some(RunInfo::Running { remaining, .. })) => Looked::HeldFor(remaining),
        Ok(_) => Looked::Free,
        Err(_) => Looked::Unknown,
    }
}
