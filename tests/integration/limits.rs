//! Limits against abuse, seen as clients would: the caps on `/locks`
//! requests in flight (503 `overloaded`, with room kept for waiters and for
//! holders' extends and releases, and probes still answered).

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use crate::support::{TestApp, assert_lease_ms};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

/// Opens a connection and sends a POST whose body never finishes: the
/// request holds its slot until the connection is closed (or its request
/// timeout ends it).
async fn stalled_request(app: &TestApp, name: &str) -> TcpStream {
    let addr = app.url("").trim_start_matches("http://").to_owned();
    let mut stream = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /locks/{name} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// Waits until the server has started serving `n` requests (gauge).
async fn until_in_flight(app: &TestApp, n: f64) {
    let seen = crate::support::eventually(Duration::from_secs(5), || async {
        let text = app.metrics().await;
        // The scrape itself is one request in flight.
        crate::support::metric(&text, "lockd_http_requests_in_flight", &[]).unwrap_or(0.0) > n
    })
    .await;
    assert!(seen, "fewer than {n} requests in flight");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_cap_get_503_overloaded_and_probes_still_answer() {
    // Room for 1 request + 1 waiter: 2 in all.
    let app = TestApp::redis_with(|s| {
        s.limits.max_requests = NonZeroUsize::MIN;
        s.limits.max_waiters = NonZeroUsize::MIN;
        s.limits.request_timeout = Duration::from_millis(20_000);
    })
    .await;
    let first = stalled_request(&app, "cap:a").await;
    let second = stalled_request(&app, "cap:b").await;
    until_in_flight(&app, 2.0).await;

    let refused = app.acquire("cap:c", None).await;
    let problem = refused.expect_problem(503, "overloaded");
    assert_eq!(problem["retry_after_ms"], 1000);
    assert_eq!(refused.header("retry-after").as_deref(), Some("1"));
    assert_eq!(
        app.holder("cap:c").await,
        None,
        "an overloaded request wrote"
    );
    // Inspects share the acquires' room; probes and scrapes are not capped.
    app.inspect("cap:c").await.expect_problem(503, "overloaded");
    app.get("/healthz").await.expect_status(200);
    app.get("/readyz").await.expect_status(200);
    assert!(app.metrics().await.contains("lockd_http_requests_total"));

    // The room comes back when the stalled requests go.
    drop((first, second));
    let served = crate::support::eventually(Duration::from_secs(5), || async {
        app.acquire("cap:c", None).await.status == 201
    })
    .await;
    assert!(served, "the cap did not free its slots");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c11_parked_waiters_cannot_take_the_room_of_other_requests() {
    // 1 request + 2 waiters: two parked waiters leave one slot.
    let app = TestApp::redis_with(|s| {
        s.limits.max_requests = NonZeroUsize::MIN;
        s.limits.max_waiters = NonZeroUsize::new(2).expect("not 0");
    })
    .await;
    app.acquire("cap:held", None).await.expect_status(201);
    let mut parked = Vec::new();
    for _ in 0..2 {
        let client = app.client.clone();
        let url = app.url("/locks/cap:held?wait_ms=10000");
        parked.push(tokio::spawn(async move { client.post(url).send().await }));
    }
    until_in_flight(&app, 2.0).await;
    // The one slot left serves another lock.
    app.acquire("cap:other", None).await.expect_status(201);
    for waiter in parked {
        waiter.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_extend_and_release_while_acquires_and_waiters_fill_the_cap() {
    // The acquires' room: 1 request + 1 waiter.
    let app = TestApp::redis_with(|s| {
        s.limits.max_requests = NonZeroUsize::MIN;
        s.limits.max_waiters = NonZeroUsize::MIN;
        s.limits.request_timeout = Duration::from_millis(20_000);
    })
    .await;
    let grant = app.acquire_ttl("cap:held", 30_000).await;
    grant.expect_status(201);
    let token = grant.token();
    // A waiter parked on the held lock, and an acquire in flight.
    let client = app.client.clone();
    let url = app.url("/locks/cap:held?wait_ms=10000&ttl_ms=5000");
    let waiter = tokio::spawn(async move { client.post(url).send().await });
    let stalled = stalled_request(&app, "cap:stalled").await;
    until_in_flight(&app, 2.0).await;
    app.acquire("cap:other", None)
        .await
        .expect_problem(503, "overloaded");

    // The holder still extends and releases.
    let sent = Instant::now();
    let extended = app.extend_ttl("cap:held", &token, 60_000).await;
    extended.expect_status(200);
    assert_lease_ms(Some(extended.u64("ttl_ms")), 60_000, sent);
    let (_, pttl) = app.holder("cap:held").await.expect("still held");
    assert!(pttl > 30_000, "the extend did not reach Redis: PTTL {pttl}");
    app.release("cap:held", &token).await.expect_status(204);
    // ... and the lock goes to the waiter, not to a lapsed lease.
    let handed = waiter.await.unwrap().unwrap();
    assert_eq!(handed.status(), 201);
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_cannot_take_the_room_of_extends_and_releases() {
    // The acquires' room is one request and one waiter; a flood of
    // acquires that fills it leaves the holders' room whole.
    let app = TestApp::redis_with(|s| {
        s.limits.max_requests = NonZeroUsize::MIN;
        s.limits.max_waiters = NonZeroUsize::MIN;
        s.limits.request_timeout = Duration::from_millis(20_000);
    })
    .await;
    let grant = app.acquire_ttl("cap:mine", 30_000).await;
    grant.expect_status(201);
    let token = grant.token();
    let first = stalled_request(&app, "cap:a").await;
    let second = stalled_request(&app, "cap:b").await;
    until_in_flight(&app, 2.0).await;
    app.acquire("cap:c", None)
        .await
        .expect_problem(503, "overloaded");
    app.extend_ttl("cap:mine", &token, 10_000)
        .await
        .expect_status(200);
    app.release("cap:mine", &token).await.expect_status(204);
    assert_eq!(
        app.holder("cap:mine").await,
        None,
        "the release did not write"
    );
    drop((first, second));
}
