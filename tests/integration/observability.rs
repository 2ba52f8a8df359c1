//! Observability, driven over HTTP as a client (or a Prometheus server)
//! would see it: the metric families and their `namespace` label (bounded,
//! with `other`), hold times, expirations, contention, waiters and pool
//! gauges; a scrape that `promtool` accepts; `--metrics-listen`; request IDs
//! in headers and problem documents; request timeouts; `/docs`; and
//! readiness during a graceful shutdown.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Reply, TestApp, backend_tests, eventually, metric, random_token, samples};
use futures::future::select_all;
use lockd::config::Settings;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

backend_tests!(
    expirations_count_404_releases_and_extends,
    contention_counts_first_try_refusals,
    waiters_gauge_by_namespace,
    request_ids_are_echoed_or_generated_and_named_in_problems,
    docs_page_renders_the_spec,
);

backend_tests!(
    mod short_request_timeout = |s: &mut ::lockd::config::Settings| s.limits.request_timeout = ::std::time::Duration::from_millis(300);
    a_wait_longer_than_the_request_timeout_is_allowed,
);

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Every family lockd exports over Redis, with its Prometheus type.
const FAMILIES: &[(&str, &str)] = &[
    ("lockd_acquire_total", "counter"),
    ("lockd_acquire_contended_total", "counter"),
    ("lockd_acquire_wait_seconds", "histogram"),
    ("lockd_lock_hold_seconds", "histogram"),
    ("lockd_lock_expired_total", "counter"),
    ("lockd_extend_total", "counter"),
    ("lockd_release_total", "counter"),
    ("lockd_waiters", "gauge"),
    ("lockd_backend_duration_seconds", "histogram"),
    ("lockd_backend_errors_total", "counter"),
    ("lockd_quorum_failures_total", "counter"),
    ("lockd_replica_ack_failures_total", "counter"),
    ("lockd_redis_pool_size", "gauge"),
    ("lockd_redis_pool_available", "gauge"),
    ("lockd_redis_pool_waiting", "gauge"),
    ("lockd_http_requests_in_flight", "gauge"),
    ("lockd_http_requests_total", "counter"),
    ("lockd_http_request_duration_seconds", "histogram"),
    ("lockd_build_info", "gauge"),
    ("lockd_store_mode", "gauge"),
    ("lockd_redis_failovers_total", "counter"),
    ("process_resident_memory_bytes", "gauge"),
    ("process_cpu_seconds_total", "counter"),
    ("process_open_fds", "gauge"),
    ("process_max_fds", "gauge"),
    ("process_start_time_seconds", "gauge"),
];

/// The sample names of the lock families labelled by `namespace` (one
/// sample name per family: `_count` for histograms).
const NAMESPACED: &[&str] = &[
    "lockd_acquire_total",
    "lockd_acquire_contended_total",
    "lockd_acquire_wait_seconds_count",
    "lockd_lock_hold_seconds_count",
    "lockd_lock_expired_total",
    "lockd_extend_total",
    "lockd_release_total",
    "lockd_waiters",
];

/// The `result` labels of each counter that has one.
const ACQUIRE_RESULTS: &[&str] = &["acquired", "reacquired", "contended", "timeout", "error"];
const RELEASE_RESULTS: &[&str] = &["released", "not_held", "not_owner", "error"];
const EXTEND_RESULTS: &[&str] = &["extended", "not_held", "not_owner", "error"];

/// The value of `name{labels..}` (summed over the other labels); panics,
/// showing the scrape, when there is no such sample.
#[track_caller]
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric(text, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in\n{text}"))
}

/// The `namespace` labels of the lock families in a scrape.
fn namespaces(text: &str) -> BTreeSet<String> {
    samples(text)
        .into_iter()
        .filter(|s| NAMESPACED.contains(&s.name.as_str()))
        .filter_map(|s| s.labels.get("namespace").cloned())
        .collect()
}

/// Asserts that every series of namespace `ns` exists, with every result
/// label of the counters that have one.
#[track_caller]
fn assert_namespace_series(text: &str, ns: &str) {
    for name in NAMESPACED {
        value(text, name, &[("namespace", ns)]);
    }
    for (name, results) in [
        ("lockd_acquire_total", ACQUIRE_RESULTS),
        ("lockd_acquire_wait_seconds_count", ACQUIRE_RESULTS),
        ("lockd_release_total", RELEASE_RESULTS),
        ("lockd_extend_total", EXTEND_RESULTS),
    ] {
        for result in results {
            value(text, name, &[("namespace", ns), ("result", result)]);
        }
    }
}

/// `lockd_waiters{namespace=ns}` now.
async fn waiters_in(app: &TestApp, ns: &str) -> f64 {
    value(&app.metrics().await, "lockd_waiters", &[("namespace", ns)])
}

/// Sends `method url` through `client` with optional JSON and headers;
/// `Err` when no HTTP answer came.
async fn try_request(
    client: &reqwest::Client,
    method: Method,
    url: String,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Result<Reply, reqwest::Error> {
    let mut request = client.request(method, url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    Reply::read(request.send().await?).await
}

/// Sends a request on its own task (so it can stay in flight while the
/// test goes on) and returns its answer through the handle.
fn spawn_request(
    app: &TestApp,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> JoinHandle<Reply> {
    let client = app.client.clone();
    let url = app.url(path);
    let what = format!("{method} {path}");
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    tokio::spawn(async move {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        try_request(&client, method, url, &headers, body)
            .await
            .unwrap_or_else(|e| panic!("{what}: no HTTP answer: {e}"))
    })
}

/// A waiting acquire of `name` on its own task.
fn spawn_waiter(app: &TestApp, name: &str, wait_ms: u64) -> JoinHandle<Reply> {
    spawn_request(
        app,
        Method::POST,
        &format!("/locks/{name}"),
        &[],
        Some(json!({ "ttl_ms": 30_000, "wait_ms": wait_ms })),
    )
}

/// `GET http://<addr><path>` (such as the `--metrics-listen` address).
async fn get_at(app: &TestApp, addr: SocketAddr, path: &str) -> Reply {
    try_request(
        &app.client,
        Method::GET,
        format!("http://{addr}{path}"),
        &[],
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("GET {addr}{path}: no HTTP answer: {e}"))
}

/// The metrics address of an app built with `metrics_listen`.
fn metrics_addr(app: &TestApp) -> SocketAddr {
    app.metrics_addr
        .expect("the app was built with metrics_listen")
}

/// `metrics_listen` on any free loopback port.
fn with_metrics_listener(s: &mut Settings) {
    s.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
}

/// Redlock settings for tests without node faults: a node timeout long
/// enough that a loaded machine never makes a healthy node miss a call (the
/// first call to a node also opens its connection).
fn patient_nodes(s: &mut Settings) {
    s.store.node_timeout = Duration::from_millis(2000);
}

/// Whether `id` looks like a fresh UUID: 36 characters, 8-4-4-4-12 hex.
fn is_uuid(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    id.len() == 36
        && groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Asserts that `reply` is the problem `status`/`slug` and that its
/// `request_id` member equals its `x-request-id` header; returns that ID.
#[track_caller]
fn assert_problem_names_its_request(reply: &Reply, status: u16, slug: &str) -> String {
    let body = reply.expect_problem(status, slug);
    let header = reply
        .header("x-request-id")
        .unwrap_or_else(|| panic!("no x-request-id on a {status} {slug}"));
    assert_eq!(
        body["request_id"].as_str(),
        Some(header.as_str()),
        "request_id of a {status} {slug} differs from its header: {}",
        reply.text
    );
    header
}

// ---------------------------------------------------------------------------
// Families and namespaces
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_is_in_the_first_scrape() {
    let app = TestApp::redis().await;
    let text = app.metrics().await;
    for (name, kind) in FAMILIES {
        let line = format!("# TYPE {name} {kind}");
        assert!(
            text.lines().any(|l| l == line),
            "no `{line}` in the first scrape:\n{text}"
        );
    }
    // Only `other` exists before any lock was named, with every series.
    assert_eq!(
        namespaces(&text),
        BTreeSet::from(["other".to_owned()]),
        "{text}"
    );
    assert_namespace_series(&text, "other");
    for name in NAMESPACED {
        assert_eq!(value(&text, name, &[("namespace", "other")]), 0.0, "{name}");
    }
    assert_eq!(
        value(
            &text,
            "lockd_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    let node = format!("127.0.0.1:{}", app.redis_server().port());
    for gauge in [
        "lockd_redis_pool_size",
        "lockd_redis_pool_available",
        "lockd_redis_pool_waiting",
    ] {
        value(&text, gauge, &[("node", &node)]);
    }
    for op in ["acquire", "extend", "release", "inspect"] {
        assert_eq!(
            value(&text, "lockd_quorum_failures_total", &[("op", op)]),
            0.0
        );
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = value(&text, "process_start_time_seconds", &[]);
    assert!(
        started > now - 3600.0 && started <= now + 1.0,
        "process_start_time_seconds {started} is not a recent Unix time (now {now})"
    );
    assert!(value(&text, "process_open_fds", &[]) >= 1.0);
    assert!(value(&text, "process_resident_memory_bytes", &[]) > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_past_the_limit_are_counted_as_other() {
    let app = TestApp::redis_with(|s| s.metrics.max_namespaces = 2).await;
    // `other:z` is counted as other and keeps no place; `a` and `b` take
    // the two places; `c` and `d` come too late.
    for name in ["other:z", "a:1", "a:2", "b", "c:1", "d:x", "b:9"] {
        app.acquire_ttl(name, 30_000).await.expect_status(201);
    }
    app.acquire_ttl("c:1", 30_000).await.expect_status(409);
    // A waiter past the limit waits in `other`.
    let waiter = spawn_waiter(&app, "d:x", 10_000);
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiters_in(&app, "other").await == 1.0
        })
        .await,
        "a waiter on d:x is not counted in lockd_waiters{{namespace=other}}"
    );
    waiter.abort();
    let text = app.metrics().await;
    let kept: BTreeSet<String> = ["a", "b", "other"].map(str::to_owned).into();
    assert_eq!(namespaces(&text), kept, "{text}");
    for ns in &kept {
        assert_namespace_series(&text, ns);
    }
    let acquired = |ns: &str| {
        value(
            &text,
            "lockd_acquire_total",
            &[("namespace", ns), ("result", "acquired")],
        )
    };
    assert_eq!(acquired("a"), 2.0, "a:1 and a:2");
    assert_eq!(acquired("b"), 2.0, "b and b:9");
    assert_eq!(acquired("other"), 3.0, "other:z, c:1 and d:x");
    assert_eq!(
        value(
            &text,
            "lockd_acquire_total",
            &[("namespace", "other"), ("result", "contended")]
        ),
        1.0,
        "the 409 on c:1"
    );
    assert_eq!(
        value(
            &text,
            "lockd_acquire_contended_total",
            &[("namespace", "other")]
        ),
        2.0,
        "the 409 on c:1 and the waiter on d:x"
    );
    assert_eq!(value(&text, "lockd_waiters", &[("namespace", "a")]), 0.0);
    assert_eq!(
        value(&text, "lockd_acquire_total", &[("namespace", "a")]),
        2.0,
        "nothing else counted in a"
    );
}

// ---------------------------------------------------------------------------
// Hold time, expirations, contention, waiters
// ---------------------------------------------------------------------------

/// Holds `h:1` for about 300 ms, renewing and extending it just before
/// the release, and checks the hold time recorded at that release: it
/// counts from the grant (not from the renewal); failed releases record
/// none.
async fn hold_time_is_recorded_at_release_on(app: &TestApp) {
    let token = random_token();
    let body = json!({ "ttl_ms": 30_000, "token": token });
    let grant = app.acquire("h:1", Some(body.clone())).await;
    grant.expect_status(201);
    let before = app.metrics().await;
    assert_eq!(
        value(
            &before,
            "lockd_lock_hold_seconds_count",
            &[("namespace", "h")]
        ),
        0.0,
        "no hold time before the release"
    );
    // The hold itself, not a synchronization.
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.acquire("h:1", Some(body)).await.expect_status(200);
    app.extend_ttl("h:1", &token, 30_000)
        .await
        .expect_status(200);
    app.release("h:1", &random_token())
        .await
        .expect_problem(409, "not-lock-owner");
    app.release("h:1", &token).await.expect_status(204);
    app.release("h:1", &token)
        .await
        .expect_problem(404, "lock-not-held");
    let text = app.metrics().await;
    let h = [("namespace", "h")];
    assert_eq!(
        value(&text, "lockd_lock_hold_seconds_count", &h),
        1.0,
        "one sample, from the successful release only"
    );
    let sum = value(&text, "lockd_lock_hold_seconds_sum", &h);
    assert!(
        (0.3..30.0).contains(&sum),
        "held about 0.3 s, recorded {sum} s"
    );
    assert_eq!(
        value(
            &text,
            "lockd_lock_hold_seconds_bucket",
            &[("namespace", "h"), ("le", "0.1")]
        ),
        0.0,
        "a 300 ms hold is not under 0.1 s"
    );
    assert_eq!(
        value(
            &text,
            "lockd_lock_hold_seconds_bucket",
            &[("namespace", "h"), ("le", "+Inf")]
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_time_is_recorded_at_release_over_memory() {
    hold_time_is_recorded_at_release_on(&TestApp::memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_time_is_recorded_at_release_over_redis() {
    hold_time_is_recorded_at_release_on(&TestApp::redis().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_time_is_recorded_at_release_over_redlock() {
    hold_time_is_recorded_at_release_on(&TestApp::redlock(3, patient_nodes).await).await;
}

async fn expirations_count_404_releases_and_extends(app: &TestApp) {
    let grant = app.acquire_ttl("e:1", 100).await;
    grant.expect_status(201);
    let token = grant.token();
    assert!(
        eventually(Duration::from_secs(5), || async {
            app.inspect("e:1").await.status == 404
        })
        .await,
        "the 100 ms lease never ran out"
    );
    app.extend_ttl("e:1", &token, 30_000)
        .await
        .expect_problem(404, "lock-not-held");
    app.release("e:1", &token)
        .await
        .expect_problem(404, "lock-not-held");
    // A refusal for another holder's lock is no expiry.
    app.acquire_ttl("e:2", 30_000).await.expect_status(201);
    app.release("e:2", &random_token())
        .await
        .expect_problem(409, "not-lock-owner");
    app.extend_ttl("e:2", &random_token(), 30_000)
        .await
        .expect_problem(409, "not-lock-owner");
    let text = app.metrics().await;
    let e = |result: &'static str| [("namespace", "e"), ("result", result)];
    assert_eq!(
        value(&text, "lockd_lock_expired_total", &[("namespace", "e")]),
        2.0
    );
    assert_eq!(value(&text, "lockd_extend_total", &e("not_held")), 1.0);
    assert_eq!(value(&text, "lockd_release_total", &e("not_held")), 1.0);
    assert_eq!(value(&text, "lockd_extend_total", &e("not_owner")), 1.0);
    assert_eq!(value(&text, "lockd_release_total", &e("not_owner")), 1.0);
    assert_eq!(
        value(
            &text,
            "lockd_lock_hold_seconds_count",
            &[("namespace", "e")]
        ),
        0.0,
        "nothing was released"
    );
    assert_eq!(
        value(&text, "lockd_lock_expired_total", &[("namespace", "other")]),
        0.0
    );
}

async fn contention_counts_first_try_refusals(app: &TestApp) {
    let holder = app.acquire_ttl("c:x", 30_000).await;
    holder.expect_status(201);
    app.acquire_ttl("u:1", 30_000).await.expect_status(201);
    // Refused at once.
    app.acquire_ttl("c:x", 30_000)
        .await
        .expect_problem(409, "lock-held");
    // Waits, and gets the lock at the release.
    let patient = spawn_waiter(app, "c:x", 10_000);
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiters_in(app, "c").await == 1.0
        })
        .await,
        "the waiter never queued"
    );
    // Waits behind it, and times out.
    let started = Instant::now();
    app.acquire("c:x", Some(json!({ "ttl_ms": 30_000, "wait_ms": 300 })))
        .await
        .expect_problem(409, "lock-held");
    assert!(started.elapsed() >= Duration::from_millis(290));
    app.release("c:x", &holder.token()).await.expect_status(204);
    patient.await.unwrap().expect_status(201);

    let text = app.metrics().await;
    let c = |result: &'static str| [("namespace", "c"), ("result", result)];
    assert_eq!(
        value(
            &text,
            "lockd_acquire_contended_total",
            &[("namespace", "c")]
        ),
        3.0,
        "the 409, the waiter that got it and the one that timed out"
    );
    assert_eq!(value(&text, "lockd_acquire_total", &c("acquired")), 2.0);
    assert_eq!(value(&text, "lockd_acquire_total", &c("contended")), 1.0);
    assert_eq!(value(&text, "lockd_acquire_total", &c("timeout")), 1.0);
    assert_eq!(value(&text, "lockd_acquire_total", &c("reacquired")), 0.0);
    assert_eq!(value(&text, "lockd_acquire_total", &c("error")), 0.0);
    assert_eq!(
        value(&text, "lockd_acquire_wait_seconds_count", &c("timeout")),
        1.0
    );
    let waited = value(&text, "lockd_acquire_wait_seconds_sum", &c("timeout"));
    assert!(
        (0.29..30.0).contains(&waited),
        "the timed-out waiter waited 300 ms, recorded {waited} s"
    );
    assert_eq!(
        value(&text, "lockd_acquire_wait_seconds_count", &c("acquired")),
        2.0
    );
    assert_eq!(
        value(
            &text,
            "lockd_acquire_contended_total",
            &[("namespace", "u")]
        ),
        0.0,
        "a free lock is no contention"
    );
}

async fn waiters_gauge_by_namespace(app: &TestApp) {
    let holder = app.acquire_ttl("q:x", 30_000).await;
    holder.expect_status(201);
    app.acquire_ttl("r:1", 30_000).await.expect_status(201);
    let waiters = vec![
        spawn_waiter(app, "q:x", 10_000),
        spawn_waiter(app, "q:x", 10_000),
    ];
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiters_in(app, "q").await == 2.0
        })
        .await,
        "lockd_waiters{{namespace=q}} never reached 2"
    );
    let text = app.metrics().await;
    assert_eq!(value(&text, "lockd_waiters", &[("namespace", "r")]), 0.0);
    assert_eq!(
        value(&text, "lockd_waiters", &[("namespace", "other")]),
        0.0
    );
    assert_eq!(value(&text, "lockd_waiters", &[]), 2.0);

    app.release("q:x", &holder.token()).await.expect_status(204);
    let (first, _, rest) = select_all(waiters).await;
    let first = first.unwrap();
    first.expect_status(201);
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiters_in(app, "q").await == 1.0
        })
        .await,
        "lockd_waiters{{namespace=q}} did not drop to 1 after the first grant"
    );
    app.release("q:x", &first.token()).await.expect_status(204);
    let [second] = <[JoinHandle<Reply>; 1]>::try_from(rest).unwrap();
    second.await.unwrap().expect_status(201);
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiters_in(app, "q").await == 0.0
        })
        .await,
        "lockd_waiters{{namespace=q}} did not drop to 0"
    );
}

// ---------------------------------------------------------------------------
// Pools
// ---------------------------------------------------------------------------

const POOL_GAUGES: &[&str] = &[
    "lockd_redis_pool_size",
    "lockd_redis_pool_available",
    "lockd_redis_pool_waiting",
];

/// The `node` labels of a family.
fn nodes_of(text: &str, name: &str) -> BTreeSet<String> {
    samples(text)
        .into_iter()
        .filter(|s| s.name == name)
        .map(|s| s.labels.get("node").cloned().expect("a node label"))
        .collect()
}

/// Asserts one series per node in `nodes` for each pool gauge, and that
/// each pool has opened a connection, has at most that many free, and
/// nobody waits.
#[track_caller]
fn assert_pools(text: &str, nodes: &BTreeSet<String>) {
    for gauge in POOL_GAUGES {
        assert_eq!(&nodes_of(text, gauge), nodes, "{gauge} in\n{text}");
    }
    for node in nodes {
        let at = [("node", node.as_str())];
        let size = value(text, "lockd_redis_pool_size", &at);
        let available = value(text, "lockd_redis_pool_available", &at);
        assert!(
            size >= 1.0,
            "node {node}: pool size {size} after a lock call"
        );
        assert!(
            (0.0..=size).contains(&available),
            "node {node}: {available} available of {size}"
        );
        assert_eq!(value(text, "lockd_redis_pool_waiting", &at), 0.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_gauges_for_every_redis_node() {
    let redis = TestApp::redis().await;
    redis.acquire_ttl("p:1", 30_000).await.expect_status(201);
    let node = format!("127.0.0.1:{}", redis.redis_server().port());
    assert_pools(&redis.metrics().await, &BTreeSet::from([node]));

    let redlock = TestApp::redlock(3, patient_nodes).await;
    redlock.acquire_ttl("p:1", 30_000).await.expect_status(201);
    let nodes: BTreeSet<String> = (0..3).map(|i| redlock.node_label(i)).collect();
    assert_eq!(nodes.len(), 3);
    assert_pools(&redlock.metrics().await, &nodes);

    let memory = TestApp::memory().await;
    memory.acquire_ttl("p:1", 30_000).await.expect_status(201);
    let text = memory.metrics().await;
    // No Redis, no connections: the gauges are there (dashboards look the
    // same) and read 0.
    for gauge in POOL_GAUGES {
        assert_eq!(
            metric(&text, gauge, &[]),
            Some(0.0),
            "{gauge} without Redis"
        );
    }
}

// ---------------------------------------------------------------------------
// promtool
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_workload_scrape_passes_promtool() {
    if Command::new("promtool").arg("--version").output().is_err() {
        panic!("promtool is not on PATH; `scripts/ensure-deps.sh promtool` installs it");
    }
    let app = TestApp::redis_with(|s| s.store.redis_timeout = Duration::from_millis(300)).await;
    let holder = app.acquire_ttl("w:1", 30_000).await;
    holder.expect_status(201);
    app.acquire_ttl("w:1", 30_000)
        .await
        .expect_problem(409, "lock-held");
    let waiter = spawn_waiter(&app, "w:1", 10_000);
    assert!(
        eventually(Duration::from_secs(5), || async {
            waiters_in(&app, "w").await == 1.0
        })
        .await
    );
    app.acquire("w:1", Some(json!({ "wait_ms": 100 })))
        .await
        .expect_problem(409, "lock-held");
    app.extend_ttl("w:1", &holder.token(), 30_000)
        .await
        .expect_status(200);
    app.release("w:1", &holder.token()).await.expect_status(204);
    let second = waiter.await.unwrap();
    second.expect_status(201);
    app.release("w:1", &random_token())
        .await
        .expect_problem(409, "not-lock-owner");
    app.extend_ttl("gone:1", &random_token(), 1000)
        .await
        .expect_problem(404, "lock-not-held");
    app.inspect("w:1").await.expect_status(200);
    app.acquire_ttl("w:1", 0)
        .await
        .expect_problem(400, "invalid-request");
    app.get("/no/such/route")
        .await
        .expect_problem(404, "route-not-found");
    app.send(Method::DELETE, "/metrics", &[], None)
        .await
        .expect_problem(405, "method-not-allowed");
    // Errors: Redis stops answering.
    app.redis_server().sigstop();
    app.acquire_ttl("x:1", 30_000)
        .await
        .expect_problem(503, "backend-unavailable");
    app.get("/readyz").await.expect_status(503);
    app.redis_server().sigcont();
    app.release("w:1", &second.token()).await.expect_status(204);

    let text = app.metrics().await;
    assert_eq!(
        value(
            &text,
            "lockd_acquire_total",
            &[("namespace", "x"), ("result", "unavailable")]
        ),
        1.0,
        "the 503 was not counted as unavailable:\n{text}"
    );
    assert!(
        value(
            &text,
            "lockd_backend_errors_total",
            &[("kind", "unavailable")]
        ) >= 1.0
    );

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed ({}):\nstdout: {}\nstderr: {}\nscrape:\n{text}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
}

// ---------------------------------------------------------------------------
// --metrics-listen, request IDs, timeouts, /docs, shutdown
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_listen_serves_metrics_health_and_readiness_apart() {
    let app = TestApp::redis_with(with_metrics_listener).await;
    let addr = metrics_addr(&app);
    assert_ne!(addr, app.addr);
    assert_problem_names_its_request(&app.get("/metrics").await, 404, "route-not-found");
    app.acquire_ttl("ml:1", 30_000).await.expect_status(201);

    let scrape = get_at(&app, addr, "/metrics").await;
    scrape.expect_status(200);
    assert!(
        scrape
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/plain")),
        "{:?}",
        scrape.headers
    );
    let text = &scrape.text;
    assert_eq!(
        value(
            text,
            "lockd_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    assert_eq!(
        value(
            text,
            "lockd_acquire_total",
            &[("namespace", "ml"), ("result", "acquired")]
        ),
        1.0,
        "the metrics listener shows the main listener's traffic"
    );
    assert_eq!(
        value(
            text,
            "lockd_http_requests_total",
            &[("route", "unmatched"), ("status", "404")]
        ),
        1.0,
        "the main listener's /metrics is an unmatched route"
    );
    let health = get_at(&app, addr, "/healthz").await;
    health.expect_status(200);
    assert_eq!(health.json()["status"], "ok");
    let ready = get_at(&app, addr, "/readyz").await;
    ready.expect_status(200);
    assert_eq!(ready.json()["status"], "ready");
    // The lock API is on the main listener only.
    assert_problem_names_its_request(
        &get_at(&app, addr, "/locks/ml:1").await,
        404,
        "route-not-found",
    );
}

async fn request_ids_are_echoed_or_generated_and_named_in_problems(app: &TestApp) {
    let with_id = |id: &str| {
        let id = id.to_owned();
        async move {
            app.send(Method::GET, "/healthz", &[("x-request-id", &id)], None)
                .await
        }
    };
    // Usable IDs come back as they were.
    let longest = "r".repeat(128);
    for id in ["abc-123", "x", "A!~#/:;=?@[]{}|", longest.as_str()] {
        let reply = with_id(id).await;
        reply.expect_status(200);
        assert_eq!(reply.header("x-request-id").as_deref(), Some(id));
    }
    // Absent or unusable IDs are replaced by fresh UUIDs.
    let too_long = "r".repeat(129);
    let mut fresh = BTreeSet::new();
    for id in [None, Some(""), Some("has space"), Some(too_long.as_str())] {
        let reply = match id {
            None => app.get("/healthz").await,
            Some(id) => with_id(id).await,
        };
        reply.expect_status(200);
        let got = reply
            .header("x-request-id")
            .unwrap_or_else(|| panic!("no x-request-id for {id:?}"));
        assert!(
            is_uuid(&got),
            "{id:?} was answered with {got:?}, not a UUID"
        );
        fresh.insert(got);
    }
    assert_eq!(fresh.len(), 4, "the generated IDs are not all different");

    // Every problem document names its request: the client's ID...
    let reply = app
        .send(
            Method::GET,
            "/locks/n:1",
            &[("x-request-id", "trace-42")],
            None,
        )
        .await;
    assert_eq!(
        assert_problem_names_its_request(&reply, 404, "lock-not-held"),
        "trace-42"
    );
    // ... or a generated one, whatever layer answered.
    let grant = app.acquire_ttl("n:2", 30_000).await;
    grant.expect_status(201);
    assert_eq!(
        grant.header("x-request-id").map(|id| is_uuid(&id)),
        Some(true)
    );
    assert_eq!(
        grant.json().get("request_id"),
        None,
        "only problems name it"
    );
    let big = format!(r#"{{"owner":"{}"}}"#, "o".repeat(70_000));
    let token = random_token();
    let cases = [
        (app.get("/locks/n:1").await, 404, "lock-not-held"),
        (app.get("/no/such/route").await, 404, "route-not-found"),
        (
            app.send(Method::PUT, "/locks/n:1", &[], None).await,
            405,
            "method-not-allowed",
        ),
        (app.acquire_ttl("n:1", 0).await, 400, "invalid-request"),
        (
            app.acquire_ttl("bad name", 1000).await,
            400,
            "invalid-request",
        ),
        (
            app.get(&format!("/locks/n:1?token={token}")).await,
            400,
            "invalid-request",
        ),
        (app.acquire_ttl("n:2", 1000).await, 409, "lock-held"),
        (
            app.release("n:2", &random_token()).await,
            409,
            "not-lock-owner",
        ),
        (
            app.send(
                Method::POST,
                "/locks/n:3",
                &[("content-type", "application/json")],
                Some(big.into_bytes()),
            )
            .await,
            413,
            "payload-too-large",
        ),
    ];
    let mut ids = BTreeSet::new();
    for (reply, status, slug) in &cases {
        let id = assert_problem_names_its_request(reply, *status, slug);
        assert!(is_uuid(&id), "{status} {slug}: {id:?} is not a UUID");
        ids.insert(id);
    }
    assert_eq!(ids.len(), cases.len(), "a request ID was reused: {ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_other_than_waits_time_out_after_request_timeout() {
    let app = TestApp::redis_with(|s| {
        s.store.redis_timeout = Duration::from_millis(5000);
        s.limits.request_timeout = Duration::from_millis(300);
    })
    .await;
    let grant = app.acquire_ttl("t:1", 30_000).await;
    grant.expect_status(201);
    let token = grant.token();
    app.redis_server().sigstop();
    let requests = [
        (Method::GET, "/locks/t:1", "/locks/{name}"),
        (Method::PATCH, "/locks/t:1", "/locks/{name}"),
        (Method::DELETE, "/locks/t:1", "/locks/{name}"),
        (Method::GET, "/readyz", "/readyz"),
    ];
    for (method, path, _) in &requests {
        let started = Instant::now();
        let reply = app
            .send(method.clone(), path, &[("Lock-Token", &token)], None)
            .await;
        let took = started.elapsed();
        assert_problem_names_its_request(&reply, 503, "timeout");
        assert!(
            took < Duration::from_secs(3),
            "{method} {path} took {took:?}: the request timeout (300 ms) did not cut the 5 s Redis timeout"
        );
        assert!(
            took >= Duration::from_millis(250),
            "{method} {path} answered in {took:?}, before the request timeout"
        );
    }
    app.redis_server().sigcont();
    // Redis answers again: so does lockd, and the lock is still there.
    app.inspect("t:1").await.expect_status(200);
    let text = app.metrics().await;
    for (method, _, route) in &requests {
        assert_eq!(
            value(
                &text,
                "lockd_http_requests_total",
                &[
                    ("method", method.as_str()),
                    ("route", route),
                    ("status", "503")
                ]
            ),
            1.0,
            "{method} {route} 503"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_times_out_after_its_own_wait_plus_the_request_timeout() {
    let app = TestApp::redis_with(|s| {
        s.store.redis_timeout = Duration::from_millis(10_000);
        s.limits.request_timeout = Duration::from_millis(300);
        s.limits.max_wait = Duration::from_millis(5000);
    })
    .await;
    app.acquire_ttl("t:0", 30_000).await.expect_status(201);
    app.redis_server().sigstop();
    let started = Instant::now();
    let no_wait = app.acquire_ttl("t:1", 30_000).await;
    let took_no_wait = started.elapsed();
    let started = Instant::now();
    let waiting = app
        .acquire("t:2", Some(json!({ "ttl_ms": 30_000, "wait_ms": 1000 })))
        .await;
    let took_waiting = started.elapsed();
    app.redis_server().sigcont();
    assert_problem_names_its_request(&no_wait, 503, "timeout");
    assert_problem_names_its_request(&waiting, 503, "timeout");
    assert!(
        took_no_wait >= Duration::from_millis(250) && took_no_wait < Duration::from_millis(1500),
        "an acquire without wait_ms was cut after {took_no_wait:?}, not after request_timeout_ms (300 ms)"
    );
    assert!(
        took_waiting >= Duration::from_millis(1250) && took_waiting < Duration::from_secs(4),
        "an acquire with wait_ms 1000 was cut after {took_waiting:?}, not after wait_ms + request_timeout_ms (1.3 s)"
    );
    let text = app.metrics().await;
    assert_eq!(
        metric(
            &text,
            "lockd_acquire_total",
            &[("namespace", "t"), ("result", "unavailable")]
        ),
        Some(2.0),
        "timed-out acquires are counted as unavailable"
    );
}

async fn a_wait_longer_than_the_request_timeout_is_allowed(app: &TestApp) {
    assert_eq!(
        app.settings.limits.request_timeout,
        Duration::from_millis(300)
    );
    app.acquire_ttl("l:1", 30_000).await.expect_status(201);
    let started = Instant::now();
    let reply = app
        .acquire("l:1", Some(json!({ "ttl_ms": 30_000, "wait_ms": 1000 })))
        .await;
    let took = started.elapsed();
    assert_problem_names_its_request(&reply, 409, "lock-held");
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(5),
        "a 1 s wait answered after {took:?}"
    );
}

async fn docs_page_renders_the_spec(app: &TestApp) {
    let reply = app.get("/docs").await;
    reply.expect_status(200);
    let content_type = reply.header("content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("text/html"),
        "/docs is {content_type:?}"
    );
    assert!(reply.text.contains("lockd"), "{}", reply.text);
    assert!(
        reply.text.contains("/locks/{name}"),
        "the page does not embed the spec: {}",
        reply.text
    );
    assert!(
        reply.text.to_lowercase().contains("<html"),
        "{}",
        reply.text
    );
    let text = app.metrics().await;
    assert_eq!(
        value(
            &text,
            "lockd_http_requests_total",
            &[("method", "GET"), ("route", "/docs"), ("status", "200")]
        ),
        1.0,
        "/docs is counted under its declared route"
    );
    assert_eq!(
        metric(
            &text,
            "lockd_http_requests_total",
            &[("route", "unmatched")]
        )
        .unwrap_or(0.0),
        0.0,
        "/docs was counted as an unmatched route"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_when_shutdown_begins() {
    let app = TestApp::redis_with(|s| {
        with_metrics_listener(s);
        // Longer than the test keeps Redis frozen, however slow the machine.
        s.store.redis_timeout = Duration::from_millis(8000);
    })
    .await;
    let addr = metrics_addr(&app);
    let app_ref = &app;
    let scrape = move || async move { get_at(app_ref, addr, "/metrics").await.text };
    get_at(&app, addr, "/readyz").await.expect_status(200);

    let holder = app.acquire_ttl("s:1", 30_000).await;
    holder.expect_status(201);
    let waiter = spawn_waiter(&app, "s:1", 10_000);
    assert!(
        eventually(Duration::from_secs(5), || async {
            value(&scrape().await, "lockd_waiters", &[("namespace", "s")]) == 1.0
        })
        .await,
        "the waiter never queued"
    );
    // A request held up in a frozen Redis keeps the main server busy.
    app.redis_server().sigstop();
    let in_flight = spawn_request(&app, Method::GET, "/locks/s:1", &[], None);
    assert!(
        eventually(Duration::from_secs(5), || async {
            // The waiter, the GET, and this scrape.
            value(&scrape().await, "lockd_http_requests_in_flight", &[]) == 3.0
        })
        .await,
        "the GET never got in flight"
    );

    app.shut_down();
    let ended = waiter.await.unwrap();
    assert_problem_names_its_request(&ended, 503, "shutting-down");
    assert!(
        ended.header("retry-after").is_some(),
        "no Retry-After: {:?}",
        ended.headers
    );
    assert!(!in_flight.is_finished(), "the GET ended with Redis frozen");
    // The metrics listener still serves, and says not ready.
    let ready = get_at(&app, addr, "/readyz").await;
    assert_problem_names_its_request(&ready, 503, "shutting-down");
    get_at(&app, addr, "/healthz").await.expect_status(200);

    app.redis_server().sigcont();
    in_flight.await.unwrap().expect_status(200);
    assert!(
        app.stopped_within(Duration::from_secs(5)).await,
        "lockd did not stop once its last request was answered"
    );
    // The metrics listener closed with the main server.
    let fresh = TestApp::client_with_timeout(Duration::from_secs(2));
    let after = try_request(
        &fresh,
        Method::GET,
        format!("http://{addr}/readyz"),
        &[],
        None,
    )
    .await;
    assert!(
        after.is_err(),
        "the metrics listener still answers after the stop: {after:?}"
    );
}

#[test]
fn uuids_are_recognized() {
    assert!(is_uuid("3f1c1b6e-5a0e-4a8e-9d6b-2f7f1f3e9a10"));
    assert!(!is_uuid("3f1c1b6e-5a0e-4a8e-9d6b-2f7f1f3e9a1"));
    assert!(!is_uuid("3f1c1b6e5a0e-4a8e-9d6b-2f7f1f3e9a10-"));
    assert!(!is_uuid("3f1c1b6e-5a0e-4a8e-9d6b-2f7f1f3e9a1g"));
}

// ---------------------------------------------------------------------------
// Requests that never get their answer, and slow bodies
// ---------------------------------------------------------------------------

/// A waiting acquire whose client hangs up is counted: `cancelled` in the
/// lock metrics (so the contention ratio stays a ratio) and 499 in the HTTP
/// metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_wait_is_counted_as_cancelled_and_499() {
    let app = TestApp::redis().await;
    app.acquire_ttl("gone:1", 30_000).await.expect_status(201);
    app.hang_up_waits("/locks/gone:1?wait_ms=10000", 3).await;
    let counted = eventually(Duration::from_secs(5), || async {
        let text = app.metrics().await;
        metric(
            &text,
            "lockd_acquire_total",
            &[("namespace", "gone"), ("result", "cancelled")],
        ) == Some(3.0)
    })
    .await;
    let text = app.metrics().await;
    assert!(counted, "abandoned waits not counted as cancelled:\n{text}");
    assert_eq!(
        metric(
            &text,
            "lockd_http_requests_total",
            &[("method", "POST"), ("status", "499")]
        ),
        Some(3.0)
    );
    // Every acquire that met contention is in the total: the ratio is <= 1.
    let contended = value(
        &text,
        "lockd_acquire_contended_total",
        &[("namespace", "gone")],
    );
    let total = value(&text, "lockd_acquire_total", &[("namespace", "gone")]);
    assert_eq!(contended, 3.0);
    assert!(contended <= total, "contended {contended} > total {total}");
}

/// A body sent slowly cannot hold a request past `request_timeout_ms`,
/// on the acquire route too (whose limit otherwise includes the longest
/// wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_is_cut_off_at_the_request_timeout() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let app = TestApp::redis_with(|s| {
        s.limits.request_timeout = Duration::from_millis(500);
        s.limits.max_wait = Duration::from_millis(30_000);
    })
    .await;
    for method in ["POST", "PATCH"] {
        let mut stream = tokio::net::TcpStream::connect(app.addr)
            .await
            .expect("connect");
        let head = format!(
            "{method} /locks/slow:1 HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nLock-Token: {}\r\nContent-Length: 16\r\n\r\n{{\"tt",
            random_token()
        );
        let started = Instant::now();
        stream.write_all(head.as_bytes()).await.expect("send");
        let mut answer = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
        let took = started.elapsed();
        let text = String::from_utf8_lossy(&answer);
        assert!(read.is_ok(), "{method}: no answer within 5 s");
        assert!(
            text.starts_with("HTTP/1.1 503") && text.contains("urn:lockd:problem:timeout"),
            "{method}: {text}"
        );
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(3),
            "{method}: answered after {took:?}"
        );
    }
}
