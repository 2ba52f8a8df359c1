//! [`Instrumented`]: a decorator of a lock [`Node`] that times every call
//! without the lock core knowing about metrics.

use crate::lock::ProbedLock;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Metrics;
use crate::lock::history::{BrokenLease, HistoryEntry};
use crate::lock::listing::{NamePrefix, PageSize, Position, ScanPage};
use crate::lock::run::ProbedRun;
use crate::lock::run::{
    Attempt, Completed, RunInfo, RunMiss, RunResult, StartRefusal, StartRequest, Started,
};
use crate::lock::semaphore::{Permit, PermitOutcome, PermitRequest, Refusal, SemaphoreInfo};
use crate::lock::{
    AcquireRequest, Acquired, Backend, ChangeListener, ExtendTtl, Lease, LockError, LockInfo,
    LockName, LockNode, Node, Released, RunNode, SemaphoreNode, Token, WaitInterest,
};
use crate::lock::{Kind, Subject};

/// The `op` labels of `lockd_backend_duration_seconds`.
const BACKEND_OPS: &[&str] = &[
    "acquire",
    "release",
    "extend",
    "inspect",
    "ping",
    "raise_fence",
    "handoff",
    "take_permit",
    "give_back_permit",
    "extend_permit",
    "inspect_semaphore",
    "probe",
    "probe_semaphore",
    "scan",
    "inspect_many",
    "inspect_semaphores",
    "history",
    "break",
    "inspect_runs",
    "start_run",
    "complete_run",
    "abandon_run",
    "extend_run",
    "inspect_run",
    "probe_run",
];

/// A [`Node`] that times every call in
/// `lockd_backend_duration_seconds{op,node}` and counts its failures in
/// `lockd_backend_errors_total{node,kind}`, then returns the inner backend's
/// answer unchanged. One request may make several calls (a waiter retries;
/// Redlock calls every node).
pub struct Instrumented {
    inner: Arc<dyn Backend>,
    metrics: Arc<Metrics>,
    node: String,
}

impl Instrumented {
    /// Wraps `inner`, labelled `node` (such as `127.0.0.1:6379`), and creates
    /// its series at zero.
    pub fn new(inner: Arc<dyn Backend>, metrics: Arc<Metrics>, node: String) -> Self {
        for op in BACKEND_OPS {
            metrics
                .backend_duration
                .with_label_values(&[op, node.as_str()]);
        }
        for op in ["acquire", "extend"] {
            metrics.replica_ack_failures.with_label_values(&[op]);
        }
        for kind in ["unavailable", "error"] {
            metrics
                .backend_errors
                .with_label_values(&[node.as_str(), kind]);
        }
        Self {
            inner,
            metrics,
            node,
        }
    }

    async fn time<T>(
        &self,
        op: &str,
        call: impl Future<Output = Result<T, LockError>>,
    ) -> Result<T, LockError> {
        let started = Instant::now();
        let outcome = call.await;
        self.metrics
            .backend_duration
            .with_label_values(&[op, self.node.as_str()])
            .observe(started.elapsed().as_secs_f64());
        if matches!(&outcome, Err(LockError::ReplicationLagging { .. })) {
            self.metrics
                .replica_ack_failures
                .with_label_values(&[op])
                .inc();
        }
        let kind = match &outcome {
            Err(e) if e.is_transient() => Some("unavailable"),
            Err(LockError::Backend(_)) => Some("error"),
            _ => None,
        };
        if let Some(kind) = kind {
            self.metrics
                .backend_errors
                .with_label_values(&[self.node.as_str(), kind])
                .inc();
        }
        outcome
    }
}

#[async_trait]
impl Node for Instrumented {
    async fn scan(
        &self,
        kind: Kind,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<ScanPage, LockError> {
        self.time("scan", self.inner.scan(kind, prefix, at, limit))
            .await
    }

    async fn ping(&self) -> Result<(), LockError> {
        self.time("ping", self.inner.ping()).await
    }

    async fn history(&self, subject: &Subject) -> Result<Vec<HistoryEntry>, LockError> {
        self.time("history", self.inner.history(subject)).await
    }

    async fn break_leases(
        &self,
        subject: &Subject,
        fence: Option<u64>,
        by: &str,
    ) -> Result<Vec<BrokenLease>, LockError> {
        self.time("break", self.inner.break_leases(subject, fence, by))
            .await
    }

    fn counts_for_quorum(&self) -> bool {
        self.inner.counts_for_quorum()
    }

    fn watch_releases(
        &self,
        listener: Arc<dyn ChangeListener>,
        stop: CancellationToken,
    ) -> Option<Arc<dyn WaitInterest>> {
        self.inner.watch_releases(listener, stop)
    }
}

#[async_trait]
impl LockNode for Instrumented {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired, LockError> {
        self.time("acquire", self.inner.acquire(req)).await
    }

    async fn extend(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Lease, LockError> {
        self.time("extend", self.inner.extend(name, token, ttl))
            .await
    }

    async fn release(&self, name: &LockName, token: &Token) -> Result<Released, LockError> {
        self.time("release", self.inner.release(name, token)).await
    }

    async fn release_handing(
        &self,
        name: &LockName,
        token: &Token,
        next: &AcquireRequest,
    ) -> Result<(Released, Option<Result<Acquired, LockError>>), LockError> {
        self.time("handoff", self.inner.release_handing(name, token, next))
            .await
    }

    async fn holder(&self, name: &LockName) -> Result<Option<(Token, LockInfo)>, LockError> {
        self.time("inspect", self.inner.holder(name)).await
    }

    async fn raise_fence(
        &self,
        name: &LockName,
        token: &Token,
        fence: u64,
    ) -> Result<bool, LockError> {
        self.time("raise_fence", self.inner.raise_fence(name, token, fence))
            .await
    }

    async fn probe(&self, name: &LockName, marker: &str) -> Result<ProbedLock, LockError> {
        self.time("probe", self.inner.probe(name, marker)).await
    }

    async fn holders(
        &self,
        names: &[LockName],
    ) -> Result<Vec<Option<(Token, LockInfo)>>, LockError> {
        self.time("inspect_many", self.inner.holders(names)).await
    }
}

#[async_trait]
impl SemaphoreNode for Instrumented {
    async fn take_permit(
        &self,
        req: &PermitRequest,
    ) -> Result<Result<PermitOutcome, Refusal>, LockError> {
        self.time("take_permit", self.inner.take_permit(req)).await
    }

    async fn give_back_permit(
        &self,
        name: &LockName,
        token: &Token,
    ) -> Result<Option<Released>, LockError> {
        self.time("give_back_permit", self.inner.give_back_permit(name, token))
            .await
    }

    async fn extend_permit(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Option<Permit>, LockError> {
        self.time("extend_permit", self.inner.extend_permit(name, token, ttl))
            .await
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>, LockError> {
        self.time("inspect_semaphore", self.inner.inspect_semaphore(name))
            .await
    }

    async fn probe_semaphore(
        &self,
        name: &LockName,
        marker: &str,
    ) -> Result<crate::lock::semaphore::ProbedSemaphore, LockError> {
        self.time("probe_semaphore", self.inner.probe_semaphore(name, marker))
            .await
    }

    async fn semaphores(
        &self,
        names: &[LockName],
    ) -> Result<Vec<Option<SemaphoreInfo>>, LockError> {
        self.time("inspect_semaphores", self.inner.semaphores(names))
            .await
    }
}

#[async_trait]
impl RunNode for Instrumented {
    async fn start_run(
        &self,
        req: &StartRequest,
    ) -> Result<Result<Started, StartRefusal>, LockError> {
        self.time("start_run", self.inner.start_run(req)).await
    }

    async fn complete_run(
        &self,
        key: &LockName,
        token: &Token,
        result: &RunResult,
        retention: Duration,
    ) -> Result<Result<Completed, RunMiss>, LockError> {
        self.time(
            "complete_run",
            self.inner.complete_run(key, token, result, retention),
        )
        .await
    }

    async fn abandon_run(
        &self,
        key: &LockName,
        token: &Token,
        retention: Duration,
    ) -> Result<Result<(), RunMiss>, LockError> {
        self.time("abandon_run", self.inner.abandon_run(key, token, retention))
            .await
    }

    async fn extend_run(
        &self,
        key: &LockName,
        token: &Token,
        ttl: ExtendTtl,
        retention: Duration,
    ) -> Result<Result<Attempt, RunMiss>, LockError> {
        self.time(
            "extend_run",
            self.inner.extend_run(key, token, ttl, retention),
        )
        .await
    }

    async fn inspect_run(&self, key: &LockName) -> Result<Option<RunInfo>, LockError> {
        self.time("inspect_run", self.inner.inspect_run(key)).await
    }

    async fn probe_run(&self, key: &LockName, marker: &str) -> Result<ProbedRun, LockError> {
        self.time("probe_run", self.inner.probe_run(key, marker))
            .await
    }

    async fn runs(&self, keys: &[LockName]) -> Result<Vec<Option<RunInfo>>, LockError> {
        self.time("inspect_runs", self.inner.runs(keys)).await
    }
}
