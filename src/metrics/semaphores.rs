//! The semaphore metrics: the families of `lockd_semaphore_*`, labelled by
//! namespace as the lock metrics are, and fed by the `/semaphores`
//! handlers; waiters and permits held are read at scrape time.

use std::time::{Duration, SystemTime};

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec};
use tokio::time::Instant;

use super::namespace::Label;
use super::{Builder, Counted, HOLD_BUCKETS, Metrics, WAIT_BUCKETS, failure};
use crate::lock::semaphore::{PermitOutcome, Refusal};
use crate::lock::{LockError, LockName, Released};

/// The result labels of `lockd_semaphore_acquire_total`.
const TAKE_RESULTS: &[&str] = &[
    "acquired",
    "reacquired",
    "full",
    "limit_mismatch",
    "cancelled",
    "unavailable",
    "error",
];
/// The result labels of the give-back and extend counters.
const RELEASE_RESULTS: &[&str] = &["released", "not_held", "unavailable", "error"];
const EXTEND_RESULTS: &[&str] = &["extended", "not_held", "unavailable", "error"];

/// Every `lockd_semaphore_*` family.
pub(super) struct SemaphoreMetrics {
    /// `lockd_semaphore_acquire_total{namespace,result}`: acquired,
    /// reacquired, full (409, after the wait if any), limit_mismatch
    /// (409), cancelled (the client went away first), unavailable (503),
    /// error (500).
    acquire_total: IntCounterVec,
    /// `lockd_semaphore_acquire_wait_seconds{namespace}`: by namespace
    /// only, to keep a namespace's series few (the lock histogram's
    /// `result` label is most of them).
    acquire_wait: HistogramVec,
    /// `lockd_semaphore_release_total{namespace,result}`.
    release_total: IntCounterVec,
    /// `lockd_semaphore_extend_total{namespace,result}`.
    extend_total: IntCounterVec,
    /// `lockd_semaphore_permit_expired_total{namespace}`: gives back and
    /// extends answered 404, the permit having run out while held.
    expired: IntCounterVec,
    /// `lockd_semaphore_hold_seconds{namespace}`: grant to give-back.
    hold: HistogramVec,
    /// `lockd_semaphore_waiters{namespace}`: requests waiting for a permit
    /// on this instance, read at scrape time.
    waiters: IntGaugeVec,
    /// `lockd_semaphore_permits_held{namespace}`: live permits of the
    /// semaphores this instance granted permits of, read from the store at
    /// scrape time (by every instance's holders).
    permits_held: IntGaugeVec,
}

impl SemaphoreMetrics {
    pub(super) fn new(b: &Builder<'_>) -> prometheus::Result<Self> {
        let ns = &["namespace"];
        let ns_result = &["namespace", "result"];
        Ok(Self {
            acquire_total: b.counter(
                "lockd_semaphore_acquire_total",
                "Permit requests by namespace and result.",
                ns_result,
            )?,
            acquire_wait: b.histogram(
                "lockd_semaphore_acquire_wait_seconds",
                "Time from a permit request to its outcome, waiting included, in seconds.",
                ns,
                WAIT_BUCKETS,
            )?,
            release_total: b.counter(
                "lockd_semaphore_release_total",
                "Permits given back, by namespace and result.",
                ns_result,
            )?,
            extend_total: b.counter(
                "lockd_semaphore_extend_total",
                "Permit extends by namespace and result.",
                ns_result,
            )?,
            expired: b.counter(
                "lockd_semaphore_permit_expired_total",
                "Gives back and extends that found the permit already gone (404): the holder outran its TTL.",
                ns,
            )?,
            hold: b.histogram(
                "lockd_semaphore_hold_seconds",
                "Time from a permit's grant to its give-back, in seconds.",
                ns,
                HOLD_BUCKETS,
            )?,
            waiters: b.gauge(
                "lockd_semaphore_waiters",
                "Requests waiting for a permit on this instance now.",
                ns,
            )?,
            permits_held: b.gauge(
                "lockd_semaphore_permits_held",
                "Live permits of the semaphores this instance has granted permits of, read from the store at scrape time.",
                ns,
            )?,
        })
    }

    /// Creates namespace `ns`'s series at zero.
    pub(super) fn create_namespace_series(&self, ns: &str) {
        for (vec, results) in [
            (&self.acquire_total, TAKE_RESULTS),
            (&self.release_total, RELEASE_RESULTS),
            (&self.extend_total, EXTEND_RESULTS),
        ] {
            for result in results {
                vec.with_label_values(&[ns, result]);
            }
        }
        self.acquire_wait.with_label_values(&[ns]);
        self.expired.with_label_values(&[ns]);
        self.hold.with_label_values(&[ns]);
        self.waiters.with_label_values(&[ns]);
        self.permits_held.with_label_values(&[ns]);
    }
}

/// A permit request being served; see [`Metrics::pending_permit`].
pub struct PendingPermit<'a>(Counted<'a>);

impl PendingPermit<'_> {
    /// Counts the outcome and the time it took, waiting included.
    pub fn finish(self, outcome: &Result<Result<PermitOutcome, Refusal>, LockError>) {
        let result = match outcome {
            Ok(Ok(PermitOutcome::Granted(_))) => "acquired",
            Ok(Ok(PermitOutcome::Renewed(_))) => "reacquired",
            Ok(Err(Refusal::Full { .. })) => "full",
            Ok(Err(Refusal::LimitMismatch { .. })) => "limit_mismatch",
            Err(e) => failure(e),
        };
        self.0.finish(result);
    }
}

impl Metrics {
    /// Starts counting a permit request for semaphore `name` that began at
    /// `started`: counted by [`PendingPermit::finish`], or as `cancelled`
    /// if the request is dropped first.
    pub fn pending_permit(&self, name: &LockName, started: Instant) -> PendingPermit<'_> {
        PendingPermit(Counted::new(
            self,
            name,
            started,
            Self::count_permit_request,
        ))
    }

    fn count_permit_request(&self, name: &LockName, result: &str, took: Duration) {
        let ns = self.namespace(name);
        let labels = [ns.as_str(), result];
        self.semaphores
            .acquire_total
            .with_label_values(&labels)
            .inc();
        self.semaphores
            .acquire_wait
            .with_label_values(&[ns.as_str()])
            .observe(took.as_secs_f64());
    }

    /// Counts a give-back's outcome (`None`: not held), and how long the
    /// permit was held.
    pub fn observe_permit_release(
        &self,
        name: &LockName,
        outcome: &Result<Option<Released>, LockError>,
    ) {
        let ns = self.namespace(name);
        let result = self.permit_result(&ns, outcome, "released");
        self.semaphores
            .release_total
            .with_label_values(&[ns.as_str(), result])
            .inc();
        if let Ok(Some(Released {
            granted_at: Some(granted_at),
            ..
        })) = outcome
            && let Ok(held) = SystemTime::now().duration_since(*granted_at)
        {
            self.semaphores
                .hold
                .with_label_values(&[ns.as_str()])
                .observe(held.as_secs_f64());
        }
    }

    /// Counts a permit extend's outcome (`None`: not held).
    pub fn observe_permit_extend<T>(
        &self,
        name: &LockName,
        outcome: &Result<Option<T>, LockError>,
    ) {
        let ns = self.namespace(name);
        let result = self.permit_result(&ns, outcome, "extended");
        self.semaphores
            .extend_total
            .with_label_values(&[ns.as_str(), result])
            .inc();
    }

    /// The result label of a give-back or extend, counting a 404 as an
    /// expiry.
    fn permit_result<T>(
        &self,
        ns: &Label,
        outcome: &Result<Option<T>, LockError>,
        ok: &'static str,
    ) -> &'static str {
        match outcome {
            Ok(Some(_)) => ok,
            Ok(None) => {
                self.semaphores
                    .expired
                    .with_label_values(&[ns.as_str()])
                    .inc();
                "not_held"
            }
            Err(e) => failure(e),
        }
    }

    /// Sets the semaphore gauges: `waiting` lists each semaphore with
    /// waiters on this instance, `held` each known semaphore's live
    /// permits.
    pub(super) fn update_semaphores(&self, waiting: &[(String, usize)], held: &[(String, usize)]) {
        for (gauge, counts) in [
            (&self.semaphores.waiters, waiting),
            (&self.semaphores.permits_held, held),
        ] {
            for (ns, count) in self.by_namespace(counts) {
                gauge.with_label_values(&[ns.as_ref()]).set(count);
            }
        }
    }
}
