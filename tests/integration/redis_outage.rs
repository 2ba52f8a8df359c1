//! Redis outages: stopped (connections refused), frozen with SIGSTOP
//! (connections hang), or down when lockd starts. Every lock request, a
//! new watch included, must get a 503 problem with `Retry-After` within
//! about the Redis timeout,
//! never hang; `/healthz` stays 200 while `/readyz` says 503; and lockd
//! recovers by itself when Redis is back.

use std::time::{Duration, Instant};

use crate::support::{Reply, TestApp, metric, random_token};
use reqwest::Method;

/// The Redis timeout of these tests, in ms.
const TIMEOUT_MS: u64 = 300;
/// How much later than the Redis timeout an answer may come: scheduling,
/// the HTTP round trip, and one retry on a fresh connection.
const MARGIN_MS: u64 = 700;

async fn app() -> TestApp {
    TestApp::redis_with(|s| s.store.redis_timeout = Duration::from_millis(TIMEOUT_MS)).await
}

/// Sends one request and checks it gets a `backend-unavailable` 503 with
/// `Retry-After` in time.
async fn expect_unavailable(app: &TestApp, method: Method, path: &str, token: Option<&str>) {
    let headers: Vec<(&str, &str)> = token.map(|t| ("Lock-Token", t)).into_iter().collect();
    let started = Instant::now();
    let reply = app.send(method.clone(), path, &headers, None).await;
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_millis(TIMEOUT_MS + MARGIN_MS),
        "{method} {path} took {elapsed:?} with a {TIMEOUT_MS} ms Redis timeout"
    );
    assert_unavailable(&reply, &format!("{method} {path}"));
}

#[track_caller]
fn assert_unavailable(reply: &Reply, what: &str) {
    assert_eq!(reply.status, 503, "{what}: {}", reply.text);
    let problem = reply.expect_problem(503, "backend-unavailable");
    let retry_after: u64 = reply
        .header("retry-after")
        .expect("a 503 says when to retry")
        .parse()
        .expect("Retry-After in seconds");
    assert!(retry_after >= 1, "{what}: Retry-After {retry_after}");
    assert!(
        problem["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0),
        "{what}: {}",
        reply.text
    );
    assert!(
        !reply.text.to_lowercase().contains("connection refused")
            && !reply.text.contains("127.0.0.1"),
        "{what}: internal error text reached the client: {}",
        reply.text
    );
}

/// Every lock route and `/readyz` answer 503 in time, `/healthz` 200.
async fn assert_outage_answers(app: &TestApp, token: &str) {
    expect_unavailable(app, Method::POST, "/locks/k", None).await;
    expect_unavailable(app, Method::POST, "/locks/other", None).await;
    expect_unavailable(app, Method::PATCH, "/locks/k", Some(token)).await;
    expect_unavailable(app, Method::DELETE, "/locks/k", Some(token)).await;
    expect_unavailable(app, Method::GET, "/locks/k", None).await;
    // A watch's first read too, at once, not after the request timeout
    // (found by a new-user trial: 10 s).
    expect_unavailable(app, Method::GET, "/locks/k/events", None).await;
    expect_unavailable(app, Method::GET, "/semaphores/s/events", None).await;
    expect_unavailable(app, Method::GET, "/runs/r/events", None).await;
    expect_unavailable(app, Method::GET, "/readyz", None).await;
    let health = app.get("/healthz").await;
    health.expect_status(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_gives_503_with_retry_after_in_time_then_recovers() {
    let app = app().await;
    let redis = app.redis_server();
    let a = app.acquire_ttl("k", 30_000).await;
    a.expect_status(201);
    let tok_a = a.token();

    redis.stop();
    assert_outage_answers(&app, &tok_a).await;
    // Invalid input is still refused as such, without Redis.
    app.acquire_ttl("k", 0)
        .await
        .expect_problem(400, "invalid-request");

    let text = app.metrics().await;
    for counter in [
        "lockd_acquire_total",
        "lockd_extend_total",
        "lockd_release_total",
    ] {
        let down =
            metric(&text, counter, &[("result", "unavailable")]).expect("unavailable series");
        assert!(down >= 1.0, "{counter}{{unavailable}} = {down}");
        // A 503 is not a 500.
        assert_eq!(metric(&text, counter, &[("result", "error")]), Some(0.0));
    }
    assert_eq!(
        metric(&text, "lockd_acquire_total", &[("result", "unavailable")]),
        Some(2.0)
    );

    // Back without restarting lockd: the very first request works. The
    // restarted Redis has no data, so the name is free again.
    redis.start().await;
    let b = app.acquire_ttl("k", 30_000).await;
    b.expect_status(201);
    assert_eq!(app.holder_token("k").await, Some(b.token()));
    app.get("/readyz").await.expect_status(200);
    app.extend_ttl("k", &b.token(), 10_000)
        .await
        .expect_status(200);
    app.extend_ttl("k", &tok_a, 10_000)
        .await
        .expect_problem(409, "not-lock-owner");
    app.release("k", &b.token()).await.expect_status(204);
    app.inspect("k").await.expect_problem(404, "lock-not-held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_hanging_gives_503_in_time_then_recovers() {
    let app = app().await;
    let redis = app.redis_server();
    let a = app.acquire_ttl("k", 30_000).await;
    a.expect_status(201);
    let tok_a = a.token();

    redis.sigstop();
    assert_outage_answers(&app, &tok_a).await;
    redis.sigcont();

    // After the thaw, every answer belongs to its own request: a late reply
    // to a timed-out command must not be taken for a later command's.
    let mut ready = false;
    for _ in 0..50 {
        if app.get("/readyz").await.status == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ready, "/readyz did not come back within 1 s of SIGCONT");
    let (holder, _) = app.holder("k").await.expect("A's lock survived");
    assert_eq!(holder, tok_a);
    let e = app.extend_ttl("k", &tok_a, 20_000).await;
    e.expect_status(200);
    assert_eq!(e.fence(), a.fence());
    for i in 0..20 {
        let name = format!("thaw:{i}");
        let grant = app.acquire_ttl(&name, 30_000).await;
        grant.expect_status(201);
        assert_eq!(app.holder_token(&name).await, Some(grant.token()));
        let status = app.inspect(&name).await;
        status.expect_status(200);
        assert_eq!(status.fence(), grant.fence());
        app.release(&name, &grant.token()).await.expect_status(204);
    }
    app.release("k", &tok_a).await.expect_status(204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockd_starts_while_redis_is_down_and_serves_once_it_is_up() {
    let app = app().await;
    let redis = app.redis_server();
    // lockd opens no connection until the first request, so stopping Redis
    // before any request is the same as starting lockd while Redis is down.
    redis.stop();
    let token = random_token();
    assert_outage_answers(&app, &token).await;
    redis.start().await;
    let grant = app.acquire_ttl("k", 30_000).await;
    grant.expect_status(201);
    app.get("/readyz").await.expect_status(200);
}
