//! Runs through HTTP, as clients use them: `/runs/{key}` on a real Redis
//! and on the memory backend (the same answers), field cases C24–C26,
//! many first calls at once, a lapsed attempt taken over, waiting for a
//! completion and for an abandonment, retention to an empty Redis, bad
//! input, watches, a Redis Cluster, API keys, and Redlock's refusal.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{
    EventStream, PREFIX, Reply, TestApp, eventually, metric, random_token, shared_cluster,
};

crate::support::redis_and_memory_tests!(
    c24_run_stuck_an_attempt_that_died_never_blocks_its_key_longer_than_its_lease,
    c25_run_mismatch_a_key_reused_with_another_payload_is_refused_not_replayed,
    c26_run_failure_a_failed_attempt_is_retried_never_replayed_as_done,
    a_run_is_started_once_and_its_result_replayed,
    many_first_calls_at_once_start_exactly_one_attempt,
    an_attempt_taken_over_after_its_lease_ran_out_cannot_complete,
    a_waiter_gets_the_result_when_the_attempt_completes,
    a_waiter_takes_over_when_the_attempt_is_abandoned,
    a_done_run_is_forgotten_when_its_retention_ends,
    bad_input_is_refused_with_a_problem_and_writes_nothing,
    a_result_over_the_limit_is_413_and_the_attempt_goes_on,
    extend_renews_only_the_live_attempt,
    a_watch_follows_a_run_through_its_attempts_to_done,
);

fn path(key: &str) -> String {
    format!("/runs/{key}")
}

/// `POST /runs/{key}` with `body`, and the token in `Lock-Token` if given.
async fn start(app: &TestApp, key: &str, token: Option<&str>, body: Value) -> Reply {
    let headers: Vec<(&str, &str)> = token.map(|t| ("Lock-Token", t)).into_iter().collect();
    app.send_json(Method::POST, &path(key), &headers, Some(body))
        .await
}

/// `POST /runs/{key}` with `body` (a start that waits, with `wait_ms`)
/// on a task of its own; the handle gives when the answer came, and the
/// answer.
fn spawn_start(app: &TestApp, key: &str, body: Value) -> tokio::task::JoinHandle<(Instant, Reply)> {
    let client = TestApp::client_with_timeout(Duration::from_secs(60));
    let url = app.url(&path(key));
    tokio::spawn(async move {
        let response = client.post(url).json(&body).send().await.expect("answer");
        (Instant::now(), Reply::read(response).await.expect("body"))
    })
}

/// `PUT /runs/{key}/result` with the token and `body`.
async fn complete(app: &TestApp, key: &str, token: &str, body: Value) -> Reply {
    app.send_json(
        Method::PUT,
        &format!("/runs/{key}/result"),
        &[("Lock-Token", token)],
        Some(body),
    )
    .await
}

/// `DELETE /runs/{key}` with the token.
async fn abandon(app: &TestApp, key: &str, token: &str) -> Reply {
    app.send(Method::DELETE, &path(key), &[("Lock-Token", token)], None)
        .await
}

/// `GET /runs/{key}`.
async fn status(app: &TestApp, key: &str) -> Reply {
    app.get(&path(key)).await
}

/// The Redis keys of run `key` (none on the memory backend).
async fn run_keys(app: &TestApp, key: &str) -> Vec<String> {
    if !app.is_redis() {
        return Vec::new();
    }
    let mut keys: Vec<String> = app
        .redis_server()
        .keys()
        .await
        .into_iter()
        .filter(|k| k.contains(&format!("run:{{{key}}}")))
        .collect();
    keys.sort();
    keys
}

async fn c24_run_stuck_an_attempt_that_died_never_blocks_its_key_longer_than_its_lease(
    app: &TestApp,
) {
    // A lease long enough that the next request comes within it on a
    // busy machine.
    let first = start(app, "job-1", None, json!({"ttl_ms": 2000})).await;
    first.expect_status(201);
    assert_eq!(first.u64("attempt"), 1);
    // The caller vanishes: no PUT, no DELETE. Until the lease ends the key
    // is in progress, and says for how long.
    let refused = start(app, "job-1", None, json!({})).await;
    let problem = refused.expect_problem(409, "run-in-progress");
    assert!(problem["retry_after_ms"].as_u64().expect("retry_after_ms") <= 2000);
    assert!(refused.header("retry-after").is_some());
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let next = start(app, "job-1", None, json!({"ttl_ms": 5000})).await;
    next.expect_status(201);
    assert_eq!(next.str("state"), "running", "nothing was replayed");
    assert_eq!(next.u64("attempt"), 2);
    assert!(next.fence() > first.fence(), "a larger fence");
}

async fn c25_run_mismatch_a_key_reused_with_another_payload_is_refused_not_replayed(app: &TestApp) {
    let first = start(
        app,
        "evt",
        None,
        json!({"fingerprint": "a", "ttl_ms": 5000}),
    )
    .await;
    first.expect_status(201);
    let before = status(app, "evt").await.json();
    // While it runs.
    let other = start(app, "evt", None, json!({"fingerprint": "b"})).await;
    other.expect_problem(422, "fingerprint-mismatch");
    assert_eq!(status(app, "evt").await.json()["fence"], before["fence"]);
    // After it is done: refused, never the first payload's result.
    complete(
        app,
        "evt",
        &first.token(),
        json!({"result": {"charged": 1}}),
    )
    .await
    .expect_status(200);
    let other = start(app, "evt", None, json!({"fingerprint": "b"})).await;
    let problem = other.expect_problem(422, "fingerprint-mismatch");
    assert!(problem.get("result").is_none(), "{}", other.text);
    // The same fingerprint (or none) gets the result.
    let same = start(app, "evt", None, json!({"fingerprint": "a"})).await;
    same.expect_status(200);
    assert_eq!(same.json()["result"], json!({"charged": 1}));
}

async fn c26_run_failure_a_failed_attempt_is_retried_never_replayed_as_done(app: &TestApp) {
    let first = start(app, "job", None, json!({"ttl_ms": 5000})).await;
    first.expect_status(201);
    abandon(app, "job", &first.token()).await.expect_status(204);
    let seen = status(app, "job").await;
    seen.expect_status(200);
    assert_eq!(seen.str("state"), "pending");
    assert_eq!(seen.str("last_attempt"), "abandoned");
    assert!(seen.json().get("result").is_none());
    let retry = start(app, "job", None, json!({})).await;
    retry.expect_status(201);
    assert_eq!(retry.u64("attempt"), 2);
    assert!(retry.fence() > first.fence());
}

async fn a_run_is_started_once_and_its_result_replayed(app: &TestApp) {
    let token = random_token();
    let first = start(
        app,
        "daily:2026-12-02",
        Some(&token),
        json!({"ttl_ms": 5000}),
    )
    .await;
    first.expect_status(201);
    assert_eq!(first.token(), token);
    // A retry after a lost answer renews the same attempt.
    let again = start(
        app,
        "daily:2026-12-02",
        Some(&token),
        json!({"ttl_ms": 5000}),
    )
    .await;
    again.expect_status(200);
    assert_eq!(again.str("state"), "running");
    assert_eq!(again.fence(), first.fence());
    assert_eq!(again.u64("attempt"), 1);
    let running = status(app, "daily:2026-12-02").await;
    running.expect_status(200);
    assert_eq!(running.str("state"), "running");
    assert!(running.json().get("token").is_none(), "{}", running.text);
    let done = complete(
        app,
        "daily:2026-12-02",
        &token,
        json!({"result": {"rows": 42}}),
    )
    .await;
    done.expect_status(200);
    assert_eq!(done.str("state"), "done");
    assert_eq!(done.json()["result"], json!({"rows": 42}));
    // A retried PUT answers the stored run, unchanged.
    let retried = complete(app, "daily:2026-12-02", &token, json!({"result": "other"})).await;
    retried.expect_status(200);
    assert_eq!(retried.json()["result"], json!({"rows": 42}));
    assert_eq!(retried.str("completed_at"), done.str("completed_at"));
    // Every later start replays it.
    let later = start(app, "daily:2026-12-02", None, json!({})).await;
    later.expect_status(200);
    assert_eq!(later.str("state"), "done");
    assert_eq!(later.json()["result"], json!({"rows": 42}));
    assert_eq!(later.fence(), first.fence());
    assert!(later.json().get("token").is_none());
    // Nobody may abandon or extend a done run.
    abandon(app, "daily:2026-12-02", &token)
        .await
        .expect_problem(409, "not-run-owner");
    let shown = status(app, "daily:2026-12-02").await.json();
    assert_eq!(shown["state"], "done");
    assert_eq!(shown["result"], json!({"rows": 42}));
    // Each call counted once, by what it did: the retried PUT is not a
    // second completion.
    let text = app.metrics().await;
    for (outcome, count) in [
        ("started", 1.0),
        ("renewed", 1.0),
        ("completed", 1.0),
        ("repeated", 1.0),
        ("replayed", 1.0),
        ("not_owner", 1.0),
    ] {
        let counted = metric(&text, "lockd_runs_total", &[("outcome", outcome)]);
        assert_eq!(counted, Some(count), "{outcome}");
    }
}

async fn many_first_calls_at_once_start_exactly_one_attempt(app: &TestApp) {
    let calls = (0..24).map(|_| start(app, "delivery-7", None, json!({"ttl_ms": 10_000})));
    let replies = futures::future::join_all(calls).await;
    let started: Vec<&Reply> = replies.iter().filter(|r| r.status == 201).collect();
    assert_eq!(started.len(), 1, "exactly one 201");
    for reply in replies.iter().filter(|r| r.status != 201) {
        reply.expect_problem(409, "run-in-progress");
    }
    assert_eq!(started[0].u64("attempt"), 1);
}

async fn an_attempt_taken_over_after_its_lease_ran_out_cannot_complete(app: &TestApp) {
    let slow = start(app, "webhook", None, json!({"ttl_ms": 300})).await;
    slow.expect_status(201);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let ran_out = status(app, "webhook").await;
    assert_eq!(ran_out.str("state"), "pending");
    assert_eq!(ran_out.str("last_attempt"), "expired");
    let taker = start(app, "webhook", None, json!({"ttl_ms": 5000})).await;
    taker.expect_status(201);
    assert!(taker.fence() > slow.fence());
    // The slow first attempt finishes and tries to store its result.
    let late = complete(app, "webhook", &slow.token(), json!({"result": "slow"})).await;
    late.expect_problem(409, "not-run-owner");
    let late = abandon(app, "webhook", &slow.token()).await;
    late.expect_problem(409, "not-run-owner");
    // The attempt that took over keeps the run, and completes it.
    let running = status(app, "webhook").await.json();
    assert_eq!(running["state"], "running");
    assert_eq!(running["fence"], taker.fence());
    // As `GET /locks/{name}` shows a holder: `owner` null when none given,
    // `granted_at` a time.
    assert_eq!(running["owner"], Value::Null, "{running}");
    assert!(running["granted_at"].is_string(), "{running}");
    // A caller that waited and timed out is not told to wait.
    let waited = start(app, "webhook", None, json!({"wait_ms": 100})).await;
    let problem = waited.expect_problem(409, "run-in-progress");
    let detail = problem["detail"].as_str().unwrap_or("");
    assert!(detail.contains("did not end within wait_ms"), "{problem}");
    let at_once = start(app, "webhook", None, json!({})).await;
    let problem = at_once.expect_problem(409, "run-in-progress");
    let detail = problem["detail"].as_str().unwrap_or("");
    assert!(detail.contains("or start with wait_ms"), "{problem}");
    let done = complete(app, "webhook", &taker.token(), json!({"result": "fast"})).await;
    done.expect_status(200);
    assert_eq!(
        start(app, "webhook", None, json!({})).await.json()["result"],
        "fast"
    );
}

async fn a_waiter_gets_the_result_when_the_attempt_completes(app: &TestApp) {
    let first = start(app, "report", None, json!({"ttl_ms": 30_000})).await;
    first.expect_status(201);
    let waiter = spawn_start(app, "report", json!({"wait_ms": 20_000}));
    // Whether the waiter is queued before the job ends or arrives after
    // it, its answer is the result.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = Instant::now();
    complete(
        app,
        "report",
        &first.token(),
        json!({"result": {"ok": true}}),
    )
    .await
    .expect_status(200);
    let (answered, reply) = waiter.await.expect("waiter");
    reply.expect_status(200);
    assert_eq!(reply.str("state"), "done");
    assert_eq!(reply.json()["result"], json!({"ok": true}));
    // Woken by the completion, long before the 30 s lease or the 20 s wait.
    assert!(answered.duration_since(sent) < Duration::from_secs(10));
}

async fn a_waiter_takes_over_when_the_attempt_is_abandoned(app: &TestApp) {
    let first = start(app, "import", None, json!({"ttl_ms": 30_000})).await;
    first.expect_status(201);
    let waiter = spawn_start(app, "import", json!({"wait_ms": 20_000, "ttl_ms": 5000}));
    // The start waits, and the gauge says so.
    app.until_gauge("lockd_run_waiters", &[], 1.0).await;
    let sent = Instant::now();
    abandon(app, "import", &first.token())
        .await
        .expect_status(204);
    let (_, reply) = waiter.await.expect("waiter");
    reply.expect_status(201);
    assert_eq!(reply.str("state"), "running");
    assert_eq!(reply.u64("attempt"), 2);
    assert!(reply.fence() > first.fence());
    assert!(sent.elapsed() < Duration::from_secs(10));
    app.until_gauge("lockd_run_waiters", &[], 0.0).await;
}

async fn a_done_run_is_forgotten_when_its_retention_ends(app: &TestApp) {
    let first = start(app, "short", None, json!({"ttl_ms": 5000})).await;
    first.expect_status(201);
    complete(
        app,
        "short",
        &first.token(),
        json!({"result": 1, "retention_ms": 300}),
    )
    .await
    .expect_status(200);
    assert_eq!(status(app, "short").await.str("state"), "done");
    assert!(
        eventually(Duration::from_secs(10), || async {
            status(app, "short").await.status == 404
        })
        .await,
        "forgotten after its retention"
    );
    // Nothing is left in Redis but the fence counter and the history,
    // which have their own retention (--fence-retention-ms).
    let keys = run_keys(app, "short").await;
    assert!(
        keys.iter()
            .all(|k| k.ends_with(":fence") || k.ends_with(":history")),
        "{keys:?}"
    );
    for key in &keys {
        assert!(app.redis_server().pttl(key).await > 0, "{key} has a TTL");
    }
    // The key is new again, with a larger fence.
    let again = start(app, "short", None, json!({})).await;
    again.expect_status(201);
    assert_eq!(again.u64("attempt"), 1);
    assert!(again.fence() > first.fence());
}

/// A request that must be refused: method, target, headers, body, status.
type Refused<'a> = (
    Method,
    &'a str,
    Vec<(&'a str, &'a str)>,
    Option<&'a str>,
    u16,
);

async fn bad_input_is_refused_with_a_problem_and_writes_nothing(app: &TestApp) {
    let token = random_token();
    let refusals: Vec<Refused> = vec![
        (Method::POST, "/runs/a/b", vec![], None, 400),
        (Method::POST, "/runs/bad{key}", vec![], None, 400),
        (
            Method::POST,
            "/runs/k",
            vec![],
            Some(r#"{"ttl_ms":0}"#),
            400,
        ),
        (
            Method::POST,
            "/runs/k",
            vec![],
            Some(r#"{"fingerprint":""}"#),
            400,
        ),
        (
            Method::POST,
            "/runs/k",
            vec![],
            Some(r#"{"fingerprint":"tab\there"}"#),
            400,
        ),
        (
            Method::POST,
            "/runs/k",
            vec![],
            Some(r#"{"unknown":1}"#),
            400,
        ),
        (
            Method::POST,
            "/runs/k?fingerprint=a",
            vec![],
            Some(r#"{"fingerprint":"a"}"#),
            400,
        ),
        (
            Method::PUT,
            "/runs/k/result",
            vec![],
            Some(r#"{"result":1}"#),
            400,
        ),
        (
            Method::PUT,
            "/runs/k/result",
            vec![("Lock-Token", &token)],
            Some("{not json"),
            400,
        ),
        (
            Method::PUT,
            "/runs/k/result",
            vec![("Lock-Token", &token)],
            Some("{}"),
            400,
        ),
        (
            Method::PUT,
            "/runs/k/result",
            vec![("Lock-Token", &token)],
            Some(r#"{"result":1,"retention_ms":0}"#),
            400,
        ),
        (Method::DELETE, "/runs/k", vec![], None, 400),
        (Method::PATCH, "/runs/k", vec![], None, 400),
    ];
    for (method, target, headers, body, want) in refusals {
        let reply = app
            .send(
                method.clone(),
                target,
                &headers,
                body.map(|b| b.as_bytes().to_vec()),
            )
            .await;
        assert_eq!(
            reply.status, want,
            "{method} {target} {body:?}: {}",
            reply.text
        );
        let problem = reply.json();
        assert!(
            problem["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("urn:lockd:problem:")),
            "{}",
            reply.text
        );
    }
    // An unknown key: 404 for each action, and nothing is made.
    complete(app, "k", &token, json!({"result": 1}))
        .await
        .expect_problem(404, "run-not-found");
    abandon(app, "k", &token)
        .await
        .expect_problem(404, "run-not-found");
    status(app, "k").await.expect_problem(404, "run-not-found");
    assert!(run_keys(app, "k").await.is_empty());
    assert_eq!(status(app, "k").await.status, 404);
}

async fn a_result_over_the_limit_is_413_and_the_attempt_goes_on(app: &TestApp) {
    let first = start(app, "big", None, json!({"ttl_ms": 5000})).await;
    first.expect_status(201);
    let big = "x".repeat(65_536);
    let reply = complete(app, "big", &first.token(), json!({"result": big})).await;
    reply.expect_problem(413, "payload-too-large");
    let shown = status(app, "big").await.json();
    assert_eq!(shown["state"], "running", "the attempt goes on");
    // One that fits completes it.
    let fits = "x".repeat(65_536 - 2);
    complete(app, "big", &first.token(), json!({"result": fits}))
        .await
        .expect_status(200);
}

async fn extend_renews_only_the_live_attempt(app: &TestApp) {
    let first = start(app, "long", None, json!({"ttl_ms": 1000})).await;
    first.expect_status(201);
    let token = first.token();
    let extended = app
        .send_json(
            Method::PATCH,
            "/runs/long",
            &[("Lock-Token", &token)],
            Some(json!({"ttl_ms": 20_000})),
        )
        .await;
    extended.expect_status(200);
    assert_eq!(extended.fence(), first.fence());
    assert!(extended.u64("ttl_ms") > 1000);
    let other = app
        .send_json(
            Method::PATCH,
            "/runs/long",
            &[("Lock-Token", &random_token())],
            None,
        )
        .await;
    other.expect_problem(409, "not-run-owner");
    // Past the first TTL it still runs.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(status(app, "long").await.str("state"), "running");
}

/// A start that waits on an instance that never saw its namespace before
/// (the attempt was started through another) is counted in
/// `lockd_run_waiters` under its own namespace, not `other`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_start_new_to_its_instance_is_counted_in_its_namespace() {
    let a = TestApp::redis().await;
    let b = a.sibling(|_| {}).await;
    let first = start(&a, "fresh-ns:job", None, json!({"ttl_ms": 30_000})).await;
    first.expect_status(201);
    let waiter = spawn_start(&b, "fresh-ns:job", json!({"wait_ms": 20_000}));
    let ns = [("namespace", "fresh-ns")];
    b.until_gauge("lockd_run_waiters", &ns, 1.0).await;
    abandon(&a, "fresh-ns:job", &first.token())
        .await
        .expect_status(204);
    waiter.await.expect("waiter").1.expect_status(201);
    b.until_gauge("lockd_run_waiters", &ns, 0.0).await;
    assert_eq!(
        metric(
            &b.metrics().await,
            "lockd_run_waiters",
            &[("namespace", "other")]
        ),
        Some(0.0)
    );
}

/// A start that waits and whose client hangs up is counted in
/// `lockd_runs_total` as `cancelled` (it was counted nowhere), and leaves
/// the run's waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_start_whose_client_hangs_up_is_counted_as_cancelled() {
    let app = TestApp::redis().await;
    let first = start(&app, "gone:job", None, json!({"ttl_ms": 30_000})).await;
    first.expect_status(201);
    app.hang_up_waits("/runs/gone:job?wait_ms=10000", 2).await;
    let cancelled = [("namespace", "gone"), ("outcome", "cancelled")];
    let counted = eventually(Duration::from_secs(5), || async {
        metric(&app.metrics().await, "lockd_runs_total", &cancelled) == Some(2.0)
    })
    .await;
    let text = app.metrics().await;
    assert!(counted, "hung-up starts not counted as cancelled:\n{text}");
    app.until_gauge("lockd_run_waiters", &[("namespace", "gone")], 0.0)
        .await;
    // The attempt is untouched: its holder completes it.
    complete(&app, "gone:job", &first.token(), json!({"result": 1}))
        .await
        .expect_status(200);
}

/// On a Redis Cluster: a run's keys share one slot, so every script runs
/// on one node, and a waiter is woken by the completion on its shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_work_on_a_redis_cluster() {
    let cluster = shared_cluster();
    let app = TestApp::cluster_on(cluster, |_| {}).await;
    let key = format!("cluster-run-{}", random_token());
    let first = start(
        &app,
        &key,
        None,
        json!({"ttl_ms": 30_000, "fingerprint": "f"}),
    )
    .await;
    first.expect_status(201);
    start(&app, &key, None, json!({"fingerprint": "g"}))
        .await
        .expect_problem(422, "fingerprint-mismatch");
    let waiter = spawn_start(&app, &key, json!({"wait_ms": 30_000}));
    tokio::time::sleep(Duration::from_millis(300)).await;
    complete(&app, &key, &first.token(), json!({"result": [1, 2, 3]}))
        .await
        .expect_status(200);
    let (_, reply) = waiter.await.expect("waiter");
    reply.expect_status(200);
    assert_eq!(reply.json()["result"], json!([1, 2, 3]));
    assert_eq!(status(&app, &key).await.str("state"), "done");
}

/// A run's attempt key that a foreign client set with no TTL is answered
/// 409 `run-in-progress` saying so, with a suggested retry and no lease
/// end claimed (not a 500 for the PTTL of -1).
#[tokio::test]
async fn an_attempt_key_with_no_ttl_is_409_without_a_lease_end() {
    let app = TestApp::redis().await;
    let attempt = format!("{PREFIX}run:{{no-ttl}}:attempt");
    app.redis_server()
        .cmd::<()>(::redis::cmd("SET").arg(&attempt).arg("foreign"))
        .await;
    let r = start(&app, "no-ttl", None, json!({ "ttl_ms": 5000 })).await;
    let problem = r.expect_problem(409, "run-in-progress");
    let detail = problem["detail"].as_str().expect("detail");
    assert!(detail.contains("no TTL"), "{detail}");
    assert!(
        !detail.contains("at most"),
        "a lease end is claimed: {detail}"
    );
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));
}

/// Redlock keeps no runs: every run route answers 501 with the reason,
/// and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_runs_with_501() {
    let app = TestApp::redlock(3, |_| {}).await;
    let token = random_token();
    for reply in [
        start(&app, "r", None, json!({})).await,
        complete(&app, "r", &token, json!({"result": 1})).await,
        abandon(&app, "r", &token).await,
        status(&app, "r").await,
    ] {
        let problem = reply.expect_problem(501, "not-implemented");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("Redlock")),
            "{}",
            reply.text
        );
    }
    assert_eq!(app.lock_key_count().await, 0);
}

/// An API key's permissions: starting is `acquire`, completing and
/// abandoning are `release`, `GET` is `read`; its prefixes cover run keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_cover_runs_by_permission_and_prefix() {
    use lockd::auth::Permission;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let (starter, finisher) = (random_token(), random_token());
    let text = crate::support::key_entry(
        "starter",
        &starter,
        &["jobs:"],
        &[Permission::Acquire, Permission::Read],
        None,
    ) + &crate::support::key_entry(
        "finisher",
        &finisher,
        &["jobs:"],
        &[Permission::Release],
        None,
    );
    std::fs::write(&keys, text).unwrap();
    let app = TestApp::redis_with(|s| s.auth.keys_file = Some(keys)).await;
    let (starter, finisher) = (format!("Bearer {starter}"), format!("Bearer {finisher}"));
    let started = app
        .send_json(
            Method::POST,
            "/runs/jobs:1",
            &[("Authorization", &starter)],
            Some(json!({})),
        )
        .await;
    started.expect_status(201);
    let token = started.token();
    // Outside the key's prefixes.
    app.send_json(
        Method::POST,
        "/runs/other:1",
        &[("Authorization", &starter)],
        Some(json!({})),
    )
    .await
    .expect_problem(403, "forbidden");
    // Completing needs `release`.
    app.send_json(
        Method::PUT,
        "/runs/jobs:1/result",
        &[("Authorization", &starter), ("Lock-Token", &token)],
        Some(json!({"result": 1})),
    )
    .await
    .expect_problem(403, "forbidden");
    app.send_json(
        Method::PUT,
        "/runs/jobs:1/result",
        &[("Authorization", &finisher), ("Lock-Token", &token)],
        Some(json!({"result": 1})),
    )
    .await
    .expect_status(200);
    let read = app
        .send(
            Method::GET,
            "/runs/jobs:1",
            &[("Authorization", &starter)],
            None,
        )
        .await;
    read.expect_status(200);
    assert_eq!(read.str("state"), "done");
}

/// `GET /runs/{key}/events`: `state` first, then `started`, `expired` (a
/// lease that ran out), `started`, `extended`, `abandoned`, `started`,
/// `completed`, each with its attempt's fence; a new watch of the done run
/// starts with `state` `done`.
async fn a_watch_follows_a_run_through_its_attempts_to_done(app: &TestApp) {
    let mut events = EventStream::open(app, "/runs/watched/events", &[]).await;
    let state = events.expect("state").await;
    assert_eq!(state.data["state"], "unknown");
    let first = start(app, "watched", None, json!({"ttl_ms": 300})).await;
    first.expect_status(201);
    assert_eq!(events.expect("started").await.fence(), first.fence());
    assert_eq!(events.expect("expired").await.fence(), first.fence());
    let second = start(app, "watched", None, json!({"ttl_ms": 5000})).await;
    second.expect_status(201);
    assert_eq!(events.expect("started").await.fence(), second.fence());
    app.send_json(
        Method::PATCH,
        "/runs/watched",
        &[("Lock-Token", &second.token())],
        Some(json!({"ttl_ms": 6000})),
    )
    .await
    .expect_status(200);
    assert_eq!(events.expect("extended").await.fence(), second.fence());
    abandon(app, "watched", &second.token())
        .await
        .expect_status(204);
    assert_eq!(events.expect("abandoned").await.fence(), second.fence());
    let third = start(app, "watched", None, json!({"ttl_ms": 5000})).await;
    assert_eq!(events.expect("started").await.fence(), third.fence());
    complete(app, "watched", &third.token(), json!({"result": true}))
        .await
        .expect_status(200);
    assert_eq!(events.expect("completed").await.fence(), third.fence());
    let mut later = EventStream::open(app, "/runs/watched/events", &[]).await;
    let state = later.expect("state").await;
    assert_eq!(state.data["state"], "done");
    assert_eq!(state.fence(), third.fence());
    assert!(state.data.get("token").is_none());
}

/// Through Sentinel, with `--min-replicas-acked 1`: a run's start and its
/// completion go to the master Sentinel names and wait for a replica's
/// ack, and the done run is on the replica too, so a failover keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_go_to_the_sentinel_master_and_wait_for_a_replica() {
    let set = std::sync::Arc::new(crate::support::SentinelSet::start().await);
    let app = TestApp::sentinel_on(set.clone(), |s| crate::support::with_acks(s, 1)).await;
    let first = start(&app, "sent:1", None, json!({"ttl_ms": 30_000})).await;
    first.expect_status(201);
    complete(&app, "sent:1", &first.token(), json!({"result": {"n": 1}}))
        .await
        .expect_status(200);
    let replay = start(&app, "sent:1", None, json!({})).await;
    replay.expect_status(200);
    assert_eq!(replay.json()["result"], json!({"n": 1}));
    let master = set.server(set.master_port());
    let record = "lockd:run:{sent:1}:record";
    let on_master: Option<String> = master
        .cmd(::redis::cmd("HGET").arg(record).arg("state"))
        .await;
    assert_eq!(on_master.as_deref(), Some("done"));
    // The ack was waited for: a replica has the done record already.
    let mut on_a_replica = false;
    for port in set.replica_ports() {
        let state: Option<String> = set
            .server(port)
            .cmd(::redis::cmd("HGET").arg(record).arg("state"))
            .await;
        on_a_replica |= state.as_deref() == Some("done");
    }
    assert!(on_a_replica, "no replica has the done run");
}
