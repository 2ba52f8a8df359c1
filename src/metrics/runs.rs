//! The run metrics: `lockd_runs_total{namespace,outcome}`, labelled by
//! namespace as the lock metrics are, and fed by the `/runs` handlers, and
//! `lockd_run_waiters{namespace}`, read at scrape time.

use prometheus::{IntCounterVec, IntGaugeVec};

use tokio::time::Instant;

use super::{Builder, Counted, Metrics, failure};
use crate::lock::run::{Completed, RunMiss, StartRefusal, Started};
use crate::lock::{LockError, LockName};

/// The outcome labels of `lockd_runs_total`.
const OUTCOMES: &[&str] = &[
    "started",
    "taken_over",
    "renewed",
    "replayed",
    "in_progress",
    "fingerprint_mismatch",
    "completed",
    "repeated",
    "abandoned",
    "extended",
    "not_owner",
    "not_found",
    "unavailable",
    "error",
    "cancelled",
];

/// Every `lockd_run*` family.
pub(super) struct RunMetrics {
    /// `lockd_runs_total{namespace,outcome}`: starts (started, taken_over
    /// when an earlier attempt's lease had run out unfinished, renewed,
    /// replayed for a done run, in_progress, fingerprint_mismatch),
    /// completes, abandons and extends (completed, repeated for a retried
    /// complete, abandoned, extended,
    /// not_owner, not_found), failures (unavailable, error), and starts
    /// whose client went away first (cancelled).
    total: IntCounterVec,
    /// `lockd_run_waiters{namespace}`: starts waiting on this instance
    /// for an attempt in progress (`wait_ms`), read at scrape time.
    waiters: IntGaugeVec,
}

impl RunMetrics {
    pub(super) fn new(b: &Builder<'_>) -> prometheus::Result<Self> {
        Ok(Self {
            total: b.counter(
                "lockd_runs_total",
                "Run requests by namespace and outcome.",
                &["namespace", "outcome"],
            )?,
            waiters: b.gauge(
                "lockd_run_waiters",
                "Run starts waiting for an attempt in progress on this instance now.",
                &["namespace"],
            )?,
        })
    }

    /// Creates namespace `ns`'s series at zero.
    pub(super) fn create_namespace_series(&self, ns: &str) {
        for outcome in OUTCOMES {
            self.total.with_label_values(&[ns, outcome]);
        }
        self.waiters.with_label_values(&[ns]);
    }
}

/// The outcome label of a complete, an abandon or an extend that changed
/// nothing.
fn missed(miss: &RunMiss) -> &'static str {
    match miss {
        RunMiss::Unknown => "not_found",
        RunMiss::NotOwner { .. } => "not_owner",
    }
}

impl Metrics {
    /// Sets `lockd_run_waiters` from each run key with waiters and how
    /// many (every known namespace, at zero when none waits in it).
    pub(super) fn update_run_waiters(&self, waiting: &[(String, usize)]) {
        for (ns, count) in self.by_namespace(waiting) {
            self.runs
                .waiters
                .with_label_values(&[ns.as_ref()])
                .set(count);
        }
    }

    fn count_run(&self, key: &LockName, outcome: &str) {
        let ns = self.namespace(key);
        self.runs
            .total
            .with_label_values(&[ns.as_str(), outcome])
            .inc();
    }

    /// Starts counting a start of run `key`: counted by
    /// [`PendingRunStart::finish`], or as `cancelled` if the request is
    /// dropped first (its client went away, during a wait most often).
    pub fn pending_run_start(&self, key: &LockName) -> PendingRunStart<'_> {
        PendingRunStart(Counted::new(
            self,
            key,
            Instant::now(),
            |m, key, outcome, _| {
                m.count_run(key, outcome);
            },
        ))
    }
}

/// A run start being served; see [`Metrics::pending_run_start`].
pub struct PendingRunStart<'a>(Counted<'a>);

impl PendingRunStart<'_> {
    /// Counts the start's outcome.
    pub fn finish(self, outcome: &Result<Result<Started, StartRefusal>, LockError>) {
        let label = match outcome {
            Ok(Ok(Started::New {
                took_over: false, ..
            })) => "started",
            Ok(Ok(Started::New {
                took_over: true, ..
            })) => "taken_over",
            Ok(Ok(Started::Renewed(_))) => "renewed",
            Ok(Ok(Started::Done(_))) => "replayed",
            Ok(Err(StartRefusal::InProgress { .. })) => "in_progress",
            Ok(Err(StartRefusal::FingerprintMismatch)) => "fingerprint_mismatch",
            Err(e) => failure(e),
        };
        self.0.finish(label);
    }
}

impl Metrics {
    /// Counts a complete's outcome.
    pub fn observe_run_complete(
        &self,
        key: &LockName,
        outcome: &Result<Result<Completed, RunMiss>, LockError>,
    ) {
        // A retried complete counts once, as `repeated`, not again as
        // `completed`.
        let label = match outcome {
            Ok(Ok(Completed::Now(_))) => "completed",
            Ok(Ok(Completed::Before(_))) => "repeated",
            Ok(Err(miss)) => missed(miss),
            Err(e) => failure(e),
        };
        self.count_run(key, label);
    }

    /// Counts an abandon's (`ok` "abandoned") or an extend's (`ok`
    /// "extended") outcome.
    pub fn observe_run_end<T>(
        &self,
        key: &LockName,
        outcome: &Result<Result<T, RunMiss>, LockError>,
        ok: &'static str,
    ) {
        let label = match outcome {
            Ok(Ok(_)) => ok,
            Ok(Err(miss)) => missed(miss),
            Err(e) => failure(e),
        };
        self.count_run(key, label);
    }
}
