//! Prometheus metrics: one [`Registry`] per application (so tests can run
//! several apps in one process), lock outcome metrics fed by the handlers,
//! HTTP metrics fed by a middleware, pool and queue gauges read at scrape
//! time, and [`Instrumented`], which times every backend call.
//!
//! Every family is in the scrape from start-up: series whose labels are
//! known in advance are created at zero, and the lock metrics, labelled by
//! [`namespace`](namespace::namespace_of), start with the `other`
//! namespace. Units are seconds and plain counts (Prometheus base units).
//!
//! Beside this file: `instrumented` ([`Instrumented`]), `semaphores` (the
//! permit metrics), `runs` (the run metrics), `process` (the process's CPU
//! and memory) and [`namespace`] (the bounded `namespace` label).

mod instrumented;
pub mod namespace;
mod process;
mod runs;
mod semaphores;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

pub use instrumented::Instrumented;
use namespace::{Label, Namespaces, OTHER};
pub use runs::PendingRunStart;
pub use semaphores::PendingPermit;

use crate::lock::{Acquired, Kind, LockError, LockName, Mode, Released};

/// Bucket bounds in seconds for backend latency: from 100 µs (a loopback
/// Redis round trip) to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Bucket bounds in seconds for HTTP requests: as for the backend, up to
/// the default longest wait (60 s).
const HTTP_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// Bucket bounds in seconds for the time an acquire takes, waiting
/// included: up to the default `--max-wait-ms` (60 s).
const WAIT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Bucket bounds in seconds for how long a lock was held: from 1 ms to an
/// hour.
const HOLD_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// The result labels of each lock counter, created at zero for every
/// namespace so that dashboards never see a missing series.
const ACQUIRE_RESULTS: &[&str] = &[
    "acquired",
    "reacquired",
    "contended",
    "timeout",
    "mode_mismatch",
    "cancelled",
    "unavailable",
    "error",
];

/// The `mode` labels of the lock metrics (see [`Mode`]).
const MODES: [Mode; 2] = [Mode::Exclusive, Mode::Shared];
const RELEASE_RESULTS: &[&str] = &["released", "not_held", "not_owner", "unavailable", "error"];
const EXTEND_RESULTS: &[&str] = &["extended", "not_held", "not_owner", "unavailable", "error"];

/// An acquire being served; see [`Metrics::pending_acquire`].
pub struct PendingAcquire<'a> {
    metrics: &'a Metrics,
    name: LockName,
    mode: Mode,
    started: Instant,
    done: bool,
}

impl PendingAcquire<'_> {
    /// Counts the outcome and the time it took, waiting included.
    pub fn finish(mut self, outcome: &Result<Acquired, LockError>) {
        self.done = true;
        self.metrics
            .observe_acquire(&self.name, self.mode, outcome, self.started.elapsed());
    }
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.metrics
                .observe_acquire_cancelled(&self.name, self.mode, self.started.elapsed());
        }
    }
}

/// The result label of a failed operation: `unavailable` for what is
/// answered 503 (the store or a quorum did not answer, too many waiters,
/// shutting down, the request timed out), `error` for a 500 (and the 501 of
/// semaphores in Redlock mode).
fn failure(e: &LockError) -> &'static str {
    match e {
        LockError::Backend(_) | LockError::Unsupported(_) => "error",
        _ => "unavailable",
    }
}

/// A connection pool's state, read at scrape time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStatus {
    /// Connections open now.
    pub size: usize,
    /// Open connections not in use.
    pub available: usize,
    /// Calls waiting for a connection.
    pub waiting: usize,
    /// Redlock: whether the node is in its delayed restart, counting toward
    /// no quorum.
    pub in_restart_delay: bool,
}

/// Reads one node's pool.
type PoolReader = Box<dyn Fn() -> PoolStatus + Send + Sync>;

/// The master of a Sentinel set, read at scrape time.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MasterStatus {
    /// `host:port` of each master now (never a password): the one a
    /// Sentinel set names, if one is known, or those serving a cluster's
    /// slots.
    pub addresses: Vec<String>,
    /// Master changes seen since start.
    pub failovers: u64,
}

/// Reads the master.
type MasterReader = Box<dyn Fn() -> MasterStatus + Send + Sync>;

/// Every metric lockd exports.
pub struct Metrics {
    registry: Registry,
    namespaces: Namespaces,
    /// `lockd_acquire_total{namespace,result,mode}`: acquired, reacquired,
    /// contended (409), timeout (the wait ran out), mode_mismatch (409: the
    /// token holds the other mode), cancelled (the client went away
    /// first), unavailable (a 503), error (a 500); by the mode asked for
    /// (`exclusive` or `shared`).
    acquire_total: IntCounterVec,
    /// `lockd_acquire_contended_total{namespace}`: acquires that found the
    /// lock held on their first try, whatever happened next.
    acquire_contended: IntCounterVec,
    /// `lockd_acquire_wait_seconds{namespace,result,mode}`: time from an
    /// acquire request to its outcome, waiting included.
    acquire_wait: HistogramVec,
    /// `lockd_lock_hold_seconds{namespace,mode}`: grant to release,
    /// recorded at release, by the mode of the lease released.
    lock_hold: HistogramVec,
    /// `lockd_lock_expired_total{namespace}`: releases and extends answered
    /// 404, the lease having run out before the holder came back.
    lock_expired: IntCounterVec,
    /// `lockd_release_total{namespace,result}`.
    release_total: IntCounterVec,
    /// `lockd_extend_total{namespace,result}`.
    extend_total: IntCounterVec,
    /// `lockd_breaks_total{kind}`: leases an admin broke (`DELETE
    /// ...?force=true`), by kind: `lock`, `semaphore` or `run`.
    breaks: IntCounterVec,
    /// `lockd_shared_holders{namespace}`: live shared leases of the locks
    /// this instance granted shared leases of, read from the store at
    /// scrape time (by every instance's holders).
    shared_holders: IntGaugeVec,
    /// `lockd_waiters{namespace}`: requests waiting for a lock, read at
    /// scrape time.
    waiters: IntGaugeVec,
    /// `lockd_backend_duration_seconds{op,node}`: time of each call to a
    /// Redis node (or the memory backend).
    pub backend_duration: HistogramVec,
    /// `lockd_backend_errors_total{node,kind}`: failed calls, by `kind`
    /// `unavailable` (no answer in time) or `error` (Redis refused).
    pub backend_errors: IntCounterVec,
    /// `lockd_quorum_failures_total{op}`: Redlock operations for which too
    /// few nodes answered.
    quorum_failures: IntCounterVec,
    /// `lockd_replica_ack_failures_total{op}`: grants (undone), extends and releases
    /// that fewer than `--min-replicas-acked` replicas acknowledged.
    pub replica_ack_failures: IntCounterVec,
    /// `lockd_redis_pool_size{node}`, `..._available{node}`,
    /// `..._waiting{node}`, read from the pools at scrape time.
    pool_size: IntGaugeVec,
    pool_available: IntGaugeVec,
    pool_waiting: IntGaugeVec,
    /// `lockd_redlock_nodes_in_restart_delay`: Redlock nodes that restarted
    /// and count toward no quorum yet, read at scrape time.
    nodes_in_restart_delay: IntGauge,
    /// `lockd_watchers`: watches (event streams) open on this instance,
    /// read at scrape time.
    watchers: IntGauge,
    pools: Mutex<Vec<(String, PoolReader)>>,
    /// `lockd_store_mode{mode}`: 1 for the store lockd runs on (`memory`,
    /// `single`, `redlock`, `cluster` or `sentinel`).
    store_mode: IntGaugeVec,
    /// `lockd_redis_master{node}`: 1 for the master Sentinel names now, or
    /// each master of a cluster.
    redis_master: IntGaugeVec,
    /// `lockd_redis_failovers_total`: master changes seen (Sentinel), or
    /// new masters (cluster).
    failovers: IntCounter,
    master: Mutex<Option<MasterReader>>,
    /// `lockd_http_requests_in_flight`.
    pub http_in_flight: IntGauge,
    /// `lockd_http_requests_total{method,route,status}`, by route template.
    http_requests: IntCounterVec,
    /// `lockd_http_request_duration_seconds{method,route,status}`.
    http_duration: HistogramVec,
    /// The `lockd_semaphore_*` families.
    semaphores: semaphores::SemaphoreMetrics,
    runs: runs::RunMetrics,
}

/// What the metrics read at scrape time from the wait queues and the
/// store: (name, count) pairs, counted by namespace.
#[derive(Debug, Default)]
pub struct Scrape {
    /// Each lock with waiters on this instance, and how many.
    pub lock_waiters: Vec<(String, usize)>,
    /// Each semaphore with waiters on this instance, and how many.
    pub semaphore_waiters: Vec<(String, usize)>,
    /// Each run key with starts waiting on this instance, and how many.
    pub run_waiters: Vec<(String, usize)>,
    /// Each semaphore known to this instance, and its live permits.
    pub permits_held: Vec<(String, usize)>,
    /// Each lock this instance granted shared leases of, and its live
    /// shared leases.
    pub shared_held: Vec<(String, usize)>,
    /// Watches open on this instance.
    pub watchers: usize,
}

/// Registers metrics of one kind in a registry.
struct Builder<'a>(&'a Registry);

impl Builder<'_> {
    fn counter(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> prometheus::Result<IntCounterVec> {
        let c = IntCounterVec::new(Opts::new(name, help), labels)?;
        self.0.register(Box::new(c.clone()))?;
        Ok(c)
    }

    fn histogram(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> prometheus::Result<HistogramVec> {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        let h = HistogramVec::new(opts, labels)?;
        self.0.register(Box::new(h.clone()))?;
        Ok(h)
    }

    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntGaugeVec> {
        let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
        self.0.register(Box::new(g.clone()))?;
        Ok(g)
    }
}

/// A request counted exactly once: with its outcome's label by
/// [`Counted::finish`], or as `cancelled` when it is dropped first (its
/// client went away, during a wait most often). `count` records the label
/// for `name`, with the time since `started`. The shared part of
/// [`PendingPermit`] and [`PendingRunStart`].
struct Counted<'a> {
    metrics: &'a Metrics,
    name: LockName,
    started: Instant,
    count: fn(&Metrics, &LockName, &str, Duration),
    done: bool,
}

impl<'a> Counted<'a> {
    fn new(
        metrics: &'a Metrics,
        name: &LockName,
        started: Instant,
        count: fn(&Metrics, &LockName, &str, Duration),
    ) -> Self {
        Self {
            metrics,
            name: name.clone(),
            started,
            count,
            done: false,
        }
    }

    /// Counts `label`, once.
    fn finish(mut self, label: &str) {
        self.done = true;
        (self.count)(self.metrics, &self.name, label, self.started.elapsed());
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if !self.done {
            (self.count)(
                self.metrics,
                &self.name,
                "cancelled",
                self.started.elapsed(),
            );
        }
    }
}

impl Metrics {
    /// Creates and registers every metric, with at most `max_namespaces`
    /// namespaces (besides `other`) in the lock metrics' labels.
    ///
    /// # Errors
    /// When a metric's definition is invalid (a programming error).
    pub fn new(max_namespaces: usize) -> prometheus::Result<Self> {
        let registry = Registry::new();
        let b = Builder(&registry);
        let ns = &["namespace"];
        let ns_result = &["namespace", "result"];
        let ns_result_mode = &["namespace", "result", "mode"];
        let ns_mode = &["namespace", "mode"];
        let build_info = b.gauge(
            "lockd_build_info",
            "Always 1; the version of lockd that serves.",
            &["version"],
        )?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        #[cfg(target_os = "linux")]
        registry.register(Box::new(process::ProcessMetrics::new()))?;
        let http_in_flight = IntGauge::new(
            "lockd_http_requests_in_flight",
            "HTTP requests being served now, waiting ones included.",
        )?;
        registry.register(Box::new(http_in_flight.clone()))?;
        let nodes_in_restart_delay = IntGauge::new(
            "lockd_redlock_nodes_in_restart_delay",
            "Redlock nodes that restarted less than the restart delay ago: written to, but counted toward no quorum.",
        )?;
        registry.register(Box::new(nodes_in_restart_delay.clone()))?;
        let watchers = IntGauge::new(
            "lockd_watchers",
            "Watches (GET /locks/{name}/events and /semaphores/{name}/events streams) open on this instance now.",
        )?;
        registry.register(Box::new(watchers.clone()))?;
        let metrics = Self {
            acquire_total: b.counter("lockd_acquire_total", "Acquire requests by namespace, result and mode.", ns_result_mode)?,
            acquire_contended: b.counter(
                "lockd_acquire_contended_total",
                "Acquire requests that found the lock held on their first try (then failed at once, waited, or timed out).",
                ns,
            )?,
            acquire_wait: b.histogram(
                "lockd_acquire_wait_seconds",
                "Time from an acquire request to its outcome, waiting included, in seconds.",
                ns_result_mode,
                WAIT_BUCKETS,
            )?,
            lock_hold: b.histogram(
                "lockd_lock_hold_seconds",
                "Time from a grant to its release, in seconds, recorded at release.",
                ns_mode,
                HOLD_BUCKETS,
            )?,
            lock_expired: b.counter(
                "lockd_lock_expired_total",
                "Releases and extends that found the lease already gone (404): the holder outran its TTL.",
                ns,
            )?,
            release_total: b.counter("lockd_release_total", "Release requests by namespace and result.", ns_result)?,
            extend_total: b.counter("lockd_extend_total", "Extend requests by namespace and result.", ns_result)?,
            waiters: b.gauge("lockd_waiters", "Requests waiting for a lock now.", ns)?,
            breaks: b.counter(
                "lockd_breaks_total",
                "Leases an admin broke (DELETE ...?force=true), whatever their token, by kind (lock, semaphore, run).",
                &["kind"],
            )?,
            shared_holders: b.gauge(
                "lockd_shared_holders",
                "Live shared leases of the locks this instance has granted shared leases of, read from the store at scrape time.",
                ns,
            )?,
            backend_duration: b.histogram(
                "lockd_backend_duration_seconds",
                "Time of one call to a lock backend node, in seconds.",
                &["op", "node"],
                LATENCY_BUCKETS,
            )?,
            backend_errors: b.counter(
                "lockd_backend_errors_total",
                "Failed calls to a lock backend node, by kind (unavailable, error).",
                &["node", "kind"],
            )?,
            quorum_failures: b.counter(
                "lockd_quorum_failures_total",
                "Redlock operations for which too few nodes answered.",
                &["op"],
            )?,
            replica_ack_failures: b.counter(
                "lockd_replica_ack_failures_total",
                "Grants (undone), extends and releases that fewer than --min-replicas-acked replicas acknowledged in time.",
                &["op"],
            )?,
            pool_size: b.gauge("lockd_redis_pool_size", "Connections open to a Redis node.", &["node"])?,
            pool_available: b.gauge(
                "lockd_redis_pool_available",
                "Open connections to a Redis node not in use.",
                &["node"],
            )?,
            pool_waiting: b.gauge(
                "lockd_redis_pool_waiting",
                "Calls waiting for a connection to a Redis node.",
                &["node"],
            )?,
            pools: Mutex::new(Vec::new()),
            store_mode: b.gauge(
                "lockd_store_mode",
                "Always 1, for the store lockd runs on: memory, single, redlock, cluster or sentinel.",
                &["mode"],
            )?,
            redis_master: b.gauge(
                "lockd_redis_master",
                "Sentinel and cluster modes: 1 for each master lockd writes to now, by address.",
                &["node"],
            )?,
            failovers: {
                let c = IntCounter::new(
                    "lockd_redis_failovers_total",
                    "Sentinel mode: changes of master seen (+switch-master, READONLY, a lost master); cluster mode: masters that appeared (a replica promoted, a master added).",
                )?;
                registry.register(Box::new(c.clone()))?;
                c
            },
            master: Mutex::new(None),
            nodes_in_restart_delay,
            watchers,
            http_in_flight,
            http_requests: b.counter(
                "lockd_http_requests_total",
                "HTTP requests by method, route template and status.",
                &["method", "route", "status"],
            )?,
            http_duration: b.histogram(
                "lockd_http_request_duration_seconds",
                "HTTP request time by method, route template and status, in seconds.",
                &["method", "route", "status"],
                HTTP_BUCKETS,
            )?,
            semaphores: semaphores::SemaphoreMetrics::new(&b)?,
            runs: runs::RunMetrics::new(&b)?,
            namespaces: Namespaces::new(max_namespaces),
            registry,
        };
        metrics.create_namespace_series(namespace::OTHER);
        for op in ["acquire", "extend", "release", "inspect"] {
            metrics.quorum_failures.with_label_values(&[op]);
        }
        for kind in [Kind::Lock, Kind::Semaphore, Kind::Run] {
            metrics.breaks.with_label_values(&[kind.as_str()]);
        }
        Ok(metrics)
    }

    /// Creates every series of a namespace at zero.
    fn create_namespace_series(&self, ns: &str) {
        for (vec, results) in [
            (&self.release_total, RELEASE_RESULTS),
            (&self.extend_total, EXTEND_RESULTS),
        ] {
            for result in results {
                vec.with_label_values(&[ns, result]);
            }
        }
        for mode in MODES.map(Mode::as_str) {
            for result in ACQUIRE_RESULTS {
                self.acquire_total.with_label_values(&[ns, result, mode]);
                self.acquire_wait.with_label_values(&[ns, result, mode]);
            }
            self.lock_hold.with_label_values(&[ns, mode]);
        }
        self.acquire_contended.with_label_values(&[ns]);
        self.lock_expired.with_label_values(&[ns]);
        self.waiters.with_label_values(&[ns]);
        self.shared_holders.with_label_values(&[ns]);
        self.semaphores.create_namespace_series(ns);
        self.runs.create_namespace_series(ns);
    }

    /// The `namespace` label of `name`, creating its series when it is new.
    fn namespace(&self, name: &LockName) -> Label {
        self.namespace_label(name.as_str())
    }

    /// [`Metrics::namespace`] of a name as text.
    fn namespace_label(&self, name: &str) -> Label {
        let label = self.namespaces.label(name);
        if let Label::New(ns) = &label {
            self.create_namespace_series(ns);
        }
        label
    }

    /// Records the store lockd runs on (`memory`, `single`, `redlock`,
    /// `cluster`) in `lockd_store_mode`.
    pub fn set_store_mode(&self, mode: &str) {
        self.store_mode.with_label_values(&[mode]).set(1);
    }

    /// Reads the master of a Sentinel set at every scrape.
    pub fn watch_master(&self, read: impl Fn() -> MasterStatus + Send + Sync + 'static) {
        *self.master.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(read));
    }

    /// Reads `pool` at every scrape, as the pool of `node`.
    pub fn watch_pool(&self, node: &str, pool: impl Fn() -> PoolStatus + Send + Sync + 'static) {
        for gauge in [&self.pool_size, &self.pool_available, &self.pool_waiting] {
            gauge.with_label_values(&[node]);
        }
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((node.to_owned(), Box::new(pool)));
    }

    /// Creates the series of a route at zero, with the status it answers
    /// when all goes well.
    pub fn declare_route(&self, method: &str, route: &str, status: &str) {
        self.http_requests
            .with_label_values(&[method, route, status]);
        self.http_duration
            .with_label_values(&[method, route, status]);
    }

    /// Counts one HTTP request and its time.
    pub fn observe_http(&self, method: &str, route: &str, status: &str, took: Duration) {
        self.http_requests
            .with_label_values(&[method, route, status])
            .inc();
        self.http_duration
            .with_label_values(&[method, route, status])
            .observe(took.as_secs_f64());
    }

    /// Counts an acquire that found `name` held on its first try.
    pub fn observe_contention(&self, name: &LockName) {
        let ns = self.namespace(name);
        self.acquire_contended
            .with_label_values(&[ns.as_str()])
            .inc();
    }

    /// Counts an acquire request's outcome and the time it took, waiting
    /// included.
    pub fn observe_acquire(
        &self,
        name: &LockName,
        mode: Mode,
        outcome: &Result<Acquired, LockError>,
        took: Duration,
    ) {
        let result = match outcome {
            Ok(Acquired::Granted(_)) => "acquired",
            Ok(Acquired::Renewed(_)) => "reacquired",
            Err(LockError::Held { .. }) => "contended",
            Err(LockError::WaitTimedOut { .. }) => "timeout",
            Err(LockError::ModeMismatch { .. }) => "mode_mismatch",
            Err(e) => failure(e),
        };
        self.count_acquire(name, mode, result, took);
        self.count_quorum_failure("acquire", outcome);
    }

    /// Starts counting an acquire of `name` in `mode` that began at
    /// `started`: it is counted by [`PendingAcquire::finish`], or as
    /// `cancelled` if the request is dropped first (the client went away).
    pub fn pending_acquire(
        &self,
        name: &LockName,
        mode: Mode,
        started: Instant,
    ) -> PendingAcquire<'_> {
        PendingAcquire {
            metrics: self,
            name: name.clone(),
            mode,
            started,
            done: false,
        }
    }

    /// Counts an acquire whose client went away before the answer.
    pub fn observe_acquire_cancelled(&self, name: &LockName, mode: Mode, took: Duration) {
        self.count_acquire(name, mode, "cancelled", took);
    }

    fn count_acquire(&self, name: &LockName, mode: Mode, result: &str, took: Duration) {
        let ns = self.namespace(name);
        let labels = [ns.as_str(), result, mode.as_str()];
        self.acquire_total.with_label_values(&labels).inc();
        self.acquire_wait
            .with_label_values(&labels)
            .observe(took.as_secs_f64());
    }

    /// Counts a release request's outcome, and how long the lock was held.
    pub fn observe_release(&self, name: &LockName, outcome: &Result<Released, LockError>) {
        let ns = self.namespace(name);
        self.count_ownership(&self.release_total, &ns, outcome, "released");
        if let Ok(Released {
            granted_at: Some(granted_at),
            mode,
        }) = outcome
        {
            // Wall-clock times: a clock stepped back gives no sample.
            if let Ok(held) = SystemTime::now().duration_since(*granted_at) {
                self.lock_hold
                    .with_label_values(&[ns.as_str(), mode.as_str()])
                    .observe(held.as_secs_f64());
            }
        }
        self.count_quorum_failure("release", outcome);
    }

    /// Counts the leases of `kind` a break ended.
    pub fn observe_breaks(&self, kind: Kind, ended: usize) {
        self.breaks
            .with_label_values(&[kind.as_str()])
            .inc_by(u64::try_from(ended).unwrap_or(u64::MAX));
    }

    /// Counts an extend request's outcome.
    pub fn observe_extend<T>(&self, name: &LockName, outcome: &Result<T, LockError>) {
        let ns = self.namespace(name);
        self.count_ownership(&self.extend_total, &ns, outcome, "extended");
        self.count_quorum_failure("extend", outcome);
    }

    /// Counts an inspect request's outcome (only quorum failures matter).
    pub fn observe_inspect<T>(&self, outcome: &Result<T, LockError>) {
        self.count_quorum_failure("inspect", outcome);
    }

    /// Counts a release or extend by result, and a 404 as an expiry.
    fn count_ownership<T>(
        &self,
        counter: &IntCounterVec,
        ns: &Label,
        outcome: &Result<T, LockError>,
        ok: &str,
    ) {
        let result = match outcome {
            Ok(_) => ok,
            Err(LockError::NotHeld) => {
                self.lock_expired.with_label_values(&[ns.as_str()]).inc();
                "not_held"
            }
            Err(LockError::NotOwner) => "not_owner",
            Err(e) => failure(e),
        };
        counter.with_label_values(&[ns.as_str(), result]).inc();
    }

    fn count_quorum_failure<T>(&self, op: &str, outcome: &Result<T, LockError>) {
        if matches!(outcome, Err(LockError::QuorumUnavailable { .. })) {
            self.quorum_failures.with_label_values(&[op]).inc();
        }
    }

    /// The metrics in Prometheus text format, with the gauges read from
    /// `scrape`.
    pub fn render(&self, scrape: &Scrape) -> String {
        self.update_waiters(&scrape.lock_waiters);
        for (ns, count) in self.by_namespace(&scrape.shared_held) {
            self.shared_holders
                .with_label_values(&[ns.as_ref()])
                .set(count);
        }
        self.watchers
            .set(i64::try_from(scrape.watchers).unwrap_or(i64::MAX));
        self.update_semaphores(&scrape.semaphore_waiters, &scrape.permits_held);
        self.update_run_waiters(&scrape.run_waiters);
        self.update_pools();
        self.update_master();
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metric families.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    fn update_waiters(&self, waiting: &[(String, usize)]) {
        for (ns, count) in self.by_namespace(waiting) {
            self.waiters.with_label_values(&[ns.as_ref()]).set(count);
        }
    }

    /// The sum of `counts` by namespace, every namespace known (at zero
    /// when none of `counts` is in it). A name of a namespace not seen yet
    /// (a permit or run start still waiting, the first of its namespace
    /// here) keeps its namespace, within the limit, as its answer would.
    fn by_namespace(&self, counts: &[(String, usize)]) -> std::collections::HashMap<Arc<str>, i64> {
        let mut by_ns: std::collections::HashMap<Arc<str>, i64> = std::collections::HashMap::new();
        for (name, count) in counts {
            let ns: Arc<str> = match self.namespace_label(name) {
                Label::Known(ns) | Label::New(ns) => ns,
                Label::Other => Arc::from(OTHER),
            };
            *by_ns.entry(ns).or_default() += i64::try_from(*count).unwrap_or(i64::MAX);
        }
        for ns in self.namespaces.all() {
            by_ns.entry(ns).or_default();
        }
        by_ns
    }

    fn update_master(&self) {
        let master = self.master.lock().unwrap_or_else(|p| p.into_inner());
        let Some(read) = master.as_ref() else { return };
        let status = read();
        self.redis_master.reset();
        for address in &status.addresses {
            self.redis_master.with_label_values(&[address]).set(1);
        }
        let seen = self.failovers.get();
        self.failovers.inc_by(status.failovers.saturating_sub(seen));
    }

    fn update_pools(&self) {
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        let mut delayed = 0;
        for (node, read) in pools.iter() {
            let status = read();
            delayed += i64::from(status.in_restart_delay);
            let labels = [node.as_str()];
            let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            self.pool_size
                .with_label_values(&labels)
                .set(count(status.size));
            self.pool_available
                .with_label_values(&labels)
                .set(count(status.available));
            self.pool_waiting
                .with_label_values(&labels)
                .set(count(status.waiting));
        }
        self.nodes_in_restart_delay.set(delayed);
    }
}
