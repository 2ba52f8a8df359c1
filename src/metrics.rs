//! Prometheus metrics: one [`Registry`] per application (so tests can run
//! several apps in one process), request outcome counters fed by the
//! handlers, and [`Instrumented`], a decorator that times every backend call
//! without the lock core knowing about metrics.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};
use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::lock::{
    AcquireRequest, Acquired, Lease, LockBackend, LockError, LockInfo, LockName, ReleaseListener,
    Token, Ttl,
};

/// Bucket bounds in seconds, from 100 µs (a loopback Redis round trip) to
/// 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Every metric lockd exports.
pub struct Metrics {
    registry: Registry,
    /// `lockd_acquire_total{result}`: acquired, reacquired, contended, error.
    pub acquire_total: IntCounterVec,
    /// `lockd_release_total{result}`: released, not_held, not_owner, error.
    pub release_total: IntCounterVec,
    /// `lockd_extend_total{result}`: extended, not_held, not_owner, error.
    pub extend_total: IntCounterVec,
    /// `lockd_acquire_wait_seconds{result}`: time from an acquire request to
    /// its outcome, waiting included.
    pub acquire_wait: HistogramVec,
    /// `lockd_waiters`: requests waiting for a lock now, read at scrape time.
    pub waiters: IntGauge,
    /// `lockd_backend_duration_seconds{op,node}`: time of each call to a
    /// Redis node (or the memory backend).
    pub backend_duration: HistogramVec,
    /// `lockd_backend_errors_total{node,kind}`: failed calls, by `kind`
    /// `unavailable` (no answer in time) or `error` (Redis refused).
    pub backend_errors: IntCounterVec,
    /// `lockd_quorum_failures_total{op}`: Redlock operations for which too
    /// few nodes answered.
    pub quorum_failures: IntCounterVec,
    /// `lockd_http_requests_total{method,route,status}`, by route template.
    pub http_requests: IntCounterVec,
    /// `lockd_http_request_duration_seconds{method,route}`.
    pub http_duration: HistogramVec,
}

/// The result labels of each counter, created at zero at start-up so that
/// dashboards never see a missing series.
const ACQUIRE_RESULTS: &[&str] = &["acquired", "reacquired", "contended", "timeout", "error"];
const RELEASE_RESULTS: &[&str] = &["released", "not_held", "not_owner", "error"];
const EXTEND_RESULTS: &[&str] = &["extended", "not_held", "not_owner", "error"];
const BACKEND_OPS: &[&str] = &[
    "acquire",
    "release",
    "extend",
    "inspect",
    "ping",
    "raise_fence",
];

impl Metrics {
    /// Creates and registers every metric.
    ///
    /// # Errors
    /// When a metric's definition is invalid (a programming error).
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
            let h = HistogramVec::new(opts, labels)?;
            registry.register(Box::new(h.clone()))?;
            Ok::<_, prometheus::Error>(h)
        };
        let metrics = Self {
            acquire_total: counter(
                "lockd_acquire_total",
                "Acquire requests by result.",
                &["result"],
            )?,
            release_total: counter(
                "lockd_release_total",
                "Release requests by result.",
                &["result"],
            )?,
            extend_total: counter(
                "lockd_extend_total",
                "Extend requests by result.",
                &["result"],
            )?,
            acquire_wait: histogram(
                "lockd_acquire_wait_seconds",
                "Time from an acquire request to its outcome, waiting included, in seconds.",
                &["result"],
            )?,
            waiters: {
                let g = IntGauge::new("lockd_waiters", "Requests waiting for a lock now.")?;
                registry.register(Box::new(g.clone()))?;
                g
            },
            backend_duration: histogram(
                "lockd_backend_duration_seconds",
                "Time of one call to a lock backend node, in seconds.",
                &["op", "node"],
            )?,
            backend_errors: counter(
                "lockd_backend_errors_total",
                "Failed calls to a lock backend node, by kind (unavailable, error).",
                &["node", "kind"],
            )?,
            quorum_failures: counter(
                "lockd_quorum_failures_total",
                "Redlock operations for which too few nodes answered.",
                &["op"],
            )?,
            http_requests: counter(
                "lockd_http_requests_total",
                "HTTP requests by method, route template and status.",
                &["method", "route", "status"],
            )?,
            http_duration: histogram(
                "lockd_http_request_duration_seconds",
                "HTTP request time by method and route template, in seconds.",
                &["method", "route"],
            )?,
            registry,
        };
        for (vec, results) in [
            (&metrics.acquire_total, ACQUIRE_RESULTS),
            (&metrics.release_total, RELEASE_RESULTS),
            (&metrics.extend_total, EXTEND_RESULTS),
        ] {
            for result in results {
                vec.with_label_values(&[result]);
            }
        }
        for result in ACQUIRE_RESULTS {
            metrics.acquire_wait.with_label_values(&[result]);
        }
        for op in ["acquire", "extend", "release", "inspect"] {
            metrics.quorum_failures.with_label_values(&[op]);
        }
        Ok(metrics)
    }

    /// Counts an acquire request's outcome and the time it took, waiting
    /// included.
    pub fn observe_acquire(&self, outcome: &Result<Acquired, LockError>, took: Duration) {
        let result = match outcome {
            Ok(Acquired::Granted(_)) => "acquired",
            Ok(Acquired::Renewed(_)) => "reacquired",
            Err(LockError::Held { .. }) => "contended",
            Err(LockError::WaitTimedOut { .. }) => "timeout",
            Err(_) => "error",
        };
        self.acquire_total.with_label_values(&[result]).inc();
        self.count_quorum_failure("acquire", outcome);
        self.acquire_wait
            .with_label_values(&[result])
            .observe(took.as_secs_f64());
    }

    /// Counts a release request's outcome.
    pub fn observe_release(&self, outcome: &Result<(), LockError>) {
        let result = ownership_result(outcome, "released");
        self.release_total.with_label_values(&[result]).inc();
        self.count_quorum_failure("release", outcome);
    }

    /// Counts an inspect request's outcome (only quorum failures matter).
    pub fn observe_inspect<T>(&self, outcome: &Result<T, LockError>) {
        self.count_quorum_failure("inspect", outcome);
    }

    fn count_quorum_failure<T>(&self, op: &str, outcome: &Result<T, LockError>) {
        if matches!(outcome, Err(LockError::QuorumUnavailable { .. })) {
            self.quorum_failures.with_label_values(&[op]).inc();
        }
    }

    /// Counts an extend request's outcome.
    pub fn observe_extend<T>(&self, outcome: &Result<T, LockError>) {
        let result = ownership_result(outcome, "extended");
        self.extend_total.with_label_values(&[result]).inc();
        self.count_quorum_failure("extend", outcome);
    }

    /// The metrics in Prometheus text format; `waiting` is the number of
    /// requests waiting now.
    pub fn render(&self, waiting: usize) -> String {
        self.waiters.set(i64::try_from(waiting).unwrap_or(i64::MAX));
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// The result label of a release or extend.
fn ownership_result<T>(outcome: &Result<T, LockError>, ok: &'static str) -> &'static str {
    match outcome {
        Ok(_) => ok,
        Err(LockError::NotHeld) => "not_held",
        Err(LockError::NotOwner) => "not_owner",
        Err(_) => "error",
    }
}

/// A [`LockBackend`] node that times every call in
/// `lockd_backend_duration_seconds{op,node}` and counts its failures in
/// `lockd_backend_errors_total{node,kind}`, then returns the inner backend's
/// answer unchanged. One request may make several calls (a waiter retries;
/// Redlock calls every node).
pub struct Instrumented {
    inner: Arc<dyn LockBackend>,
    metrics: Arc<Metrics>,
    node: String,
}

impl Instrumented {
    /// Wraps `inner`, labelled `node` (such as `127.0.0.1:6379`), and creates
    /// its series at zero.
    pub fn new(inner: Arc<dyn LockBackend>, metrics: Arc<Metrics>, node: String) -> Self {
        for op in BACKEND_OPS {
            metrics
                .backend_duration
                .with_label_values(&[op, node.as_str()]);
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
        let kind = match &outcome {
            Err(LockError::Unavailable(_)) => Some("unavailable"),
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
impl LockBackend for Instrumented {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired, LockError> {
        self.time("acquire", self.inner.acquire(req)).await
    }

    async fn extend(&self, name: &LockName, token: &Token, ttl: Ttl) -> Result<Lease, LockError> {
        self.time("extend", self.inner.extend(name, token, ttl))
            .await
    }

    async fn release(&self, name: &LockName, token: &Token) -> Result<(), LockError> {
        self.time("release", self.inner.release(name, token)).await
    }

    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.time("inspect", self.inner.inspect(name)).await
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

    async fn ping(&self) -> Result<(), LockError> {
        self.time("ping", self.inner.ping()).await
    }

    fn watch_releases(&self, listener: Arc<dyn ReleaseListener>, stop: CancellationToken) {
        self.inner.watch_releases(listener, stop);
    }
}
