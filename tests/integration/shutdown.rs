//! The `lockd` binary shutting down on SIGTERM, and the log lines of a full
//! workload, as an operator sees them: a real process over a real
//! `redis-server`.
//!
//! Each lockd runs under a [`Lockd`] guard that kills it on drop, and a Redis
//! frozen with SIGSTOP is held by a [`Frozen`] guard that thaws it on drop, so
//! that a failed assertion leaves no process behind. lockd's stderr goes to a
//! file (not a pipe that nobody reads while it runs: trace logs would fill
//! the pipe and block lockd).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::support::{
    Lockd, RedisServer, Reply as Answer, free_port, lock_key, metric, random_token,
};
use nix::sys::signal::Signal;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// A redis-server frozen with SIGSTOP; thawed (SIGCONT) on drop.
struct Frozen<'a>(&'a RedisServer);

impl<'a> Frozen<'a> {
    fn freeze(redis: &'a RedisServer) -> Self {
        redis.sigstop();
        Self(redis)
    }

    /// Thaws it now.
    fn thaw(self) {
        drop(self);
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        self.0.sigcont();
    }
}

fn http_client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .expect("HTTP client")
}

/// The problem's slug of `answer`, or `ok` for a success: what the access
/// log names as `result`.
fn result_of(answer: &Answer) -> String {
    if answer.status.is_success() {
        return "ok".into();
    }
    let problem = answer.json();
    problem["type"]
        .as_str()
        .and_then(|t| t.strip_prefix("urn:lockd:problem:"))
        .unwrap_or_else(|| panic!("not a lockd problem: {problem}"))
        .to_owned()
}

/// Scrapes `url` (a `/metrics` URL).
async fn scrape(client: &reqwest::Client, url: &str) -> String {
    let reply = client.get(url).send().await.expect("scrape /metrics");
    assert_eq!(reply.status(), StatusCode::OK);
    reply.text().await.expect("metrics text")
}

/// Polls `/metrics` at `url` until `name{labels}` is `value`, at most
/// `within`; panics with the last value otherwise.
async fn until_metric(
    client: &reqwest::Client,
    url: &str,
    name: &str,
    labels: &[(&str, &str)],
    value: f64,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let now = metric(&scrape(client, url).await, name, labels);
        if now == Some(value) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name}{labels:?} is {now:?}, not {value}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a new TCP connection to `addr` gets an HTTP answer to
/// `GET /healthz` within 500 ms (a refused or reset connection, or silence,
/// is no answer).
async fn answers_on_a_new_connection(addr: &str) -> bool {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let ask = stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await;
    if ask.is_err() {
        return false;
    }
    let mut buf = [0_u8; 64];
    match tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buf)).await {
        Ok(Ok(n)) => buf[..n].starts_with(b"HTTP/"),
        _ => false,
    }
}

/// A request sent on a spawned task: its answer, and when it came.
type Pending = tokio::task::JoinHandle<(Result<Answer, reqwest::Error>, Instant)>;

fn spawn_request(request: reqwest::RequestBuilder) -> Pending {
    tokio::spawn(async move {
        let answer = match request.send().await {
            Ok(response) => Answer::read(response).await,
            Err(e) => Err(e),
        };
        (answer, Instant::now())
    })
}

/// Takes each lock of `names` for a long lease (so that no waiter retries
/// on its own for the rest of the test), then parks `per_lock` waiters on
/// each, with `wait_ms` 30 s and a token of their own; returns the holders'
/// tokens, the waiters' tokens and the waiters. Parked means: `lockd_waiters`
/// counts them all, and every first try is over: per lock, the holder's
/// acquire, the head's, and one renew-only acquire of each waiter queued
/// behind it (its token, chosen by the client, might hold the lock already:
/// it is renewed at once if so, and takes nothing otherwise); and per lock,
/// lockd's subscription to its changes is in place and the head's one look
/// that follows it is over (so that nothing more reaches Redis).
async fn hold_and_park(
    lockd: &Lockd,
    redis: &RedisServer,
    http: &reqwest::Client,
    metrics_url: &str,
    names: &[&str],
    per_lock: usize,
) -> (Vec<String>, Vec<String>, Vec<Pending>) {
    let mut holders = Vec::new();
    for name in names {
        let grant = Answer::read(
            http.post(lockd.url(&format!("/locks/{name}")))
                .json(&json!({ "ttl_ms": 120_000 }))
                .send()
                .await
                .unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(grant.status, StatusCode::CREATED, "{grant:?}");
        assert!(grant.json()["fence"].as_u64().is_some(), "{grant:?}");
        holders.push(grant.json()["token"].as_str().unwrap().to_owned());
    }
    let mut tokens = Vec::new();
    let mut waiters = Vec::new();
    for name in names {
        for _ in 0..per_lock {
            let token = random_token();
            waiters.push(spawn_request(
                http.post(lockd.url(&format!("/locks/{name}")))
                    .json(&json!({ "wait_ms": 30_000, "token": token })),
            ));
            tokens.push(token);
        }
    }
    let within = Duration::from_secs(20);
    #[allow(clippy::cast_precision_loss)]
    let (parked, acquires) = (waiters.len() as f64, ((per_lock + 1) * names.len()) as f64);
    until_metric(http, metrics_url, "lockd_waiters", &[], parked, within).await;
    until_metric(
        http,
        metrics_url,
        "lockd_backend_duration_seconds_count",
        &[("op", "acquire")],
        acquires,
        within,
    )
    .await;
    for name in names {
        redis.until_lock_channel_subscribers(name, 1).await;
    }
    #[allow(clippy::cast_precision_loss)]
    let looks = names.len() as f64;
    until_metric(
        http,
        metrics_url,
        "lockd_backend_duration_seconds_count",
        &[("op", "inspect")],
        looks,
        within,
    )
    .await;
    (holders, tokens, waiters)
}

/// Asserts that every waiter got 503 `shutting-down` with `Retry-After`
/// within 2 s of `sigterm_at`.
async fn assert_waits_ended(waiters: Vec<Pending>, sigterm_at: Instant, lockd: &Lockd) {
    let mut wrong = Vec::new();
    for (i, waiter) in waiters.into_iter().enumerate() {
        let (answer, answered_at) = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("waiter {i} got no answer within 10 s of SIGTERM"))
            .expect("waiter task");
        let after = answered_at.saturating_duration_since(sigterm_at);
        let answer = answer.unwrap_or_else(|e| panic!("waiter {i}: no HTTP answer: {e}"));
        if !answer.text.contains("urn:lockd:problem:shutting-down") {
            wrong.push(format!("waiter {i}, {after:?} after SIGTERM: {answer:?}"));
            continue;
        }
        answer.expect_problem(503, "shutting-down");
        let retry_after = answer
            .header("retry-after")
            .unwrap_or_else(|| panic!("waiter {i}: no Retry-After: {answer:?}"));
        assert!(
            retry_after.parse::<u64>().is_ok_and(|s| s >= 1),
            "waiter {i}: Retry-After {retry_after:?}"
        );
        assert!(
            after < Duration::from_secs(2),
            "waiter {i} answered {after:?} after SIGTERM"
        );
    }
    assert!(
        wrong.is_empty(),
        "waits not ended with 503 shutting-down:\n{}\nlogs:\n{}",
        wrong.join("\n"),
        lockd.stderr()
    );
}

// ---------------------------------------------------------------------------
// Shutdown
// ---------------------------------------------------------------------------

/// SIGTERM with three requests waiting for a lock and one request stuck on a
/// frozen Redis: the waits end at once with 503 `shutting-down` and
/// `Retry-After`; `/readyz` (on the metrics address) turns 503 while the
/// stuck request is still in flight; the main port takes no new connection;
/// once Redis thaws the stuck request finishes (404: the lock is free) and
/// lockd exits 0, within the shutdown timeout. No waiter was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_waiters_present() {
    const SHUTDOWN_TIMEOUT: Duration = Duration::from_millis(8000);
    const REDIS_TIMEOUT: Duration = Duration::from_millis(3000);
    let redis = RedisServer::spawn().await;
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let mut lockd = Lockd::serve(
        &[
            "--redis-url",
            &redis.url(),
            "--metrics-listen",
            &metrics_addr,
            "--redis-timeout-ms",
            "3000",
            "--shutdown-timeout-ms",
            "8000",
        ],
        &[("LOCKD_LOG", "info")],
    )
    .await;
    let metrics_url = format!("http://{metrics_addr}/metrics");
    let readyz_url = format!("http://{metrics_addr}/readyz");
    let http = http_client(Duration::from_secs(40));

    // The holder, and three waiters, each with a token of its own.
    let (holders, waiter_tokens, waiters) =
        hold_and_park(&lockd, &redis, &http, &metrics_url, &["jobs:a"], 3).await;
    let waiters_in_jobs = metric(
        &scrape(&http, &metrics_url).await,
        "lockd_waiters",
        &[("namespace", "jobs")],
    );
    assert_eq!(waiters_in_jobs, Some(3.0));
    // Requests in flight now: the three waiters and this scrape.
    let in_flight = |text: &str| metric(text, "lockd_http_requests_in_flight", &[]);
    assert_eq!(in_flight(&scrape(&http, &metrics_url).await), Some(4.0));

    // A request that cannot finish yet: Redis is frozen.
    let frozen = Frozen::freeze(&redis);
    let get_sent = Instant::now();
    let stuck = spawn_request(http.get(lockd.url("/locks/other")));
    until_metric(
        &http,
        &metrics_url,
        "lockd_http_requests_in_flight",
        &[],
        5.0,
        Duration::from_secs(2),
    )
    .await;

    lockd.signal(Signal::SIGTERM);
    let sigterm_at = Instant::now();

    // The waits end at once with 503 shutting-down and Retry-After.
    assert_waits_ended(waiters, sigterm_at, &lockd).await;

    // Not ready any more, while the stuck request is still in flight.
    let ready = Answer::read(http.get(&readyz_url).send().await.expect("/readyz"))
        .await
        .unwrap();
    ready.expect_problem(503, "shutting-down");
    assert!(!stuck.is_finished(), "the stuck GET finished early");

    // The main port takes no new connection (the listener may take a moment
    // to close after SIGTERM is handled).
    let closed_by = Instant::now() + Duration::from_secs(2);
    while answers_on_a_new_connection(lockd.addr()).await {
        assert!(
            Instant::now() < closed_by,
            "the main port still answers new connections 2 s after readiness turned 503"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!stuck.is_finished(), "the stuck GET finished early");
    assert!(
        lockd.exited().is_none(),
        "lockd exited with a request in flight:\n{}",
        lockd.stderr()
    );

    // Redis thaws: the stuck request finishes, and lockd exits.
    let frozen_for = get_sent.elapsed();
    frozen.thaw();
    let (answer, _) = tokio::time::timeout(Duration::from_secs(10), stuck)
        .await
        .expect("the stuck GET got no answer within 10 s of the thaw")
        .expect("GET task");
    let answer = answer.unwrap_or_else(|e| panic!("the stuck GET got no HTTP answer: {e}"));
    assert!(
        frozen_for < REDIS_TIMEOUT,
        "the test kept Redis frozen for {frozen_for:?}, past lockd's Redis timeout \
         ({REDIS_TIMEOUT:?}): the machine is too slow for this test; GET got {answer:?}"
    );
    assert_eq!(
        answer.status,
        StatusCode::NOT_FOUND,
        "the stuck GET (Redis frozen for {frozen_for:?}) got {answer:?}; logs:\n{}",
        lockd.stderr()
    );
    answer.expect_problem(404, "lock-not-held");
    let limit = SHUTDOWN_TIMEOUT + Duration::from_secs(3);
    let exit = lockd
        .exited_within(limit.saturating_sub(sigterm_at.elapsed()))
        .await;
    let took = sigterm_at.elapsed();
    let logs = lockd.stderr();
    let exit = exit.unwrap_or_else(|| panic!("lockd still runs {took:?} after SIGTERM:\n{logs}"));
    assert_eq!(exit.code(), Some(0), "{exit}; logs:\n{logs}");
    assert!(took < limit, "lockd took {took:?} to exit");
    assert!(
        !logs.contains("after the shutdown timeout"),
        "the request in flight was cut off:\n{logs}"
    );

    // No waiter was granted: the first holder still has the lock, and no
    // other grant raised the fence.
    assert_eq!(redis.lock_token("jobs:a").await, Some(holders[0].clone()));
    assert_eq!(
        redis.fence_counter("jobs:a").await,
        redis.holder_fence("jobs:a").await
    );
    let expected: BTreeSet<String> = [
        lock_key("jobs:a"),
        format!("{}:fence", lock_key("jobs:a")),
        format!("{}:meta", lock_key("jobs:a")),
    ]
    .into();
    let keys: BTreeSet<String> = redis.keys().await.into_iter().collect();
    assert_eq!(keys, expected);
    for token in &waiter_tokens {
        assert!(!logs.contains(token.as_str()), "a token is in the logs");
    }
}

/// SIGTERM ends every wait with 503 `shutting-down` at once, however many
/// wait for a lock, even when Redis hangs: no waiter may call Redis once
/// shutdown began.
///
/// When the head of a queue leaves (as every waiter does at shutdown), it
/// wakes the next waiter; that waiter must still end with `shutting-down`,
/// not retry the lock on a Redis that does not answer (it would answer 503
/// `backend-unavailable` after `--redis-timeout-ms`). Whether the race shows
/// depends on scheduling: one queue of 40 waiters makes many promotions, and
/// the test runs a few rounds, each with a fresh lockd. (It fails as long as
/// the `select!` of `Locks::acquire_or_wait` may pick the wake-up over the
/// shutdown when both are ready; a `biased;` select with the shutdown first
/// makes it pass.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_every_wait_even_when_redis_hangs() {
    for round in 0..3 {
        eprintln!("round {round}");
        let redis = RedisServer::spawn().await;
        let mut lockd = Lockd::serve(
            &[
                "--redis-url",
                &redis.url(),
                "--redis-timeout-ms",
                "3000",
                "--shutdown-timeout-ms",
                "8000",
            ],
            &[("LOCKD_LOG", "info")],
        )
        .await;
        let metrics_url = lockd.url("/metrics");
        let http = http_client(Duration::from_secs(40));
        let names = ["queue:k"];
        let (holders, _, waiters) =
            hold_and_park(&lockd, &redis, &http, &metrics_url, &names, 40).await;

        // (On failure, the guard thaws Redis.)
        let frozen = Frozen::freeze(&redis);
        lockd.signal(Signal::SIGTERM);
        let sigterm_at = Instant::now();
        assert_waits_ended(waiters, sigterm_at, &lockd).await;
        frozen.thaw();
        let exit = lockd.exited_within(Duration::from_secs(11)).await;
        let logs = lockd.stderr();
        let exit = exit.unwrap_or_else(|| panic!("lockd did not exit after SIGTERM:\n{logs}"));
        assert_eq!(exit.code(), Some(0), "{exit}; logs:\n{logs}");
        for (name, holder) in names.iter().zip(holders) {
            assert_eq!(redis.lock_token(name).await, Some(holder));
            assert_eq!(
                redis.fence_counter(name).await,
                redis.holder_fence(name).await
            );
        }
    }
}

/// A request stuck on a frozen Redis cannot hold the process past
/// `--shutdown-timeout-ms`: lockd cuts it off and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_timeout_bounds_a_stuck_request() {
    const SHUTDOWN_TIMEOUT: Duration = Duration::from_millis(1000);
    let redis = RedisServer::spawn().await;
    let mut lockd = Lockd::serve(
        &[
            "--redis-url",
            &redis.url(),
            "--shutdown-timeout-ms",
            "1000",
            "--redis-timeout-ms",
            "20000",
        ],
        &[("LOCKD_LOG", "info")],
    )
    .await;
    let http = http_client(Duration::from_secs(30));
    let metrics_url = lockd.url("/metrics");

    let frozen = Frozen::freeze(&redis);
    let stuck = {
        let request = http.get(lockd.url("/locks/stuck"));
        tokio::spawn(async move {
            match request.send().await {
                Ok(response) => Answer::read(response).await,
                Err(e) => Err(e),
            }
        })
    };
    // In flight: the GET and this scrape.
    until_metric(
        &http,
        &metrics_url,
        "lockd_http_requests_in_flight",
        &[],
        2.0,
        Duration::from_secs(5),
    )
    .await;

    lockd.signal(Signal::SIGTERM);
    let sigterm_at = Instant::now();
    let limit = SHUTDOWN_TIMEOUT + Duration::from_secs(3);
    let exit = lockd.exited_within(limit).await;
    let took = sigterm_at.elapsed();
    frozen.thaw();
    let logs = lockd.stderr();
    let exit = exit.unwrap_or_else(|| panic!("lockd still runs {took:?} after SIGTERM:\n{logs}"));
    assert_eq!(exit.code(), Some(0), "{exit}; logs:\n{logs}");
    assert!(
        took >= SHUTDOWN_TIMEOUT.mul_f64(0.9),
        "lockd exited after {took:?}, before the shutdown timeout: was the GET in flight?\n{logs}"
    );
    assert!(took < limit, "lockd took {took:?} to exit");
    assert!(
        logs.contains("requests still open after the shutdown timeout"),
        "no warning about the request cut off:\n{logs}"
    );
    let answer = tokio::time::timeout(Duration::from_secs(5), stuck)
        .await
        .expect("the client saw nothing within 5 s of lockd's exit")
        .expect("GET task");
    assert!(
        answer.is_err(),
        "the stuck GET got an answer, though lockd exited under it: {answer:?}"
    );
}

// ---------------------------------------------------------------------------
// Logs
// ---------------------------------------------------------------------------

/// One request of a workload, with its answer.
#[derive(Debug)]
struct Sent {
    method: String,
    /// The route template lockd should log.
    route: &'static str,
    /// The lock name lockd should log, when the request reached the handler.
    lock: Option<&'static str>,
    status: u16,
    result: String,
    /// From the answer's `x-request-id`.
    request_id: String,
}

/// Drives a lockd over HTTP and records every request and answer, and every
/// token seen or sent.
struct Workload<'a> {
    lockd: &'a Lockd,
    http: reqwest::Client,
    sent: Vec<Sent>,
    tokens: Vec<String>,
}

/// What to send.
struct Ask<'b> {
    method: Method,
    /// Path and query.
    path: &'b str,
    route: &'static str,
    lock: Option<&'static str>,
    headers: &'b [(&'b str, &'b str)],
    body: Option<String>,
}

impl<'a> Workload<'a> {
    fn new(lockd: &'a Lockd) -> Self {
        Self {
            lockd,
            http: http_client(Duration::from_secs(30)),
            sent: Vec::new(),
            tokens: Vec::new(),
        }
    }

    /// A fresh client-chosen token, remembered.
    fn token(&mut self) -> String {
        let token = random_token();
        self.tokens.push(token.clone());
        token
    }

    fn request(&self, ask: &Ask<'_>) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .request(ask.method.clone(), self.lockd.url(ask.path));
        for (name, value) in ask.headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = &ask.body {
            request = request
                .header("content-type", "application/json")
                .body(body.clone());
        }
        request
    }

    /// Records `answer` to `ask`, and the token of a grant.
    fn record(&mut self, ask: &Ask<'_>, answer: &Answer) {
        let request_id = answer
            .header("x-request-id")
            .unwrap_or_else(|| panic!("no x-request-id: {answer:?}"));
        let grant = serde_json::from_str::<Value>(&answer.text).ok();
        if let Some(token) = grant.as_ref().and_then(|g| g["token"].as_str()) {
            self.tokens.push(token.to_owned());
        }
        self.sent.push(Sent {
            method: ask.method.to_string(),
            route: ask.route,
            lock: ask.lock,
            status: answer.status.as_u16(),
            result: result_of(answer),
            request_id,
        });
    }

    /// Sends `ask`, expects `status`, and returns the answer.
    async fn send(&mut self, ask: Ask<'_>, status: u16) -> Answer {
        let answer = Answer::read(self.request(&ask).send().await.unwrap())
            .await
            .unwrap();
        assert_eq!(
            answer.status.as_u16(),
            status,
            "{} {}: {answer:?}",
            ask.method,
            ask.path
        );
        self.record(&ask, &answer);
        answer
    }
}

fn body(value: &Value) -> Option<String> {
    Some(value.to_string())
}

/// Runs every kind of request once against `lockd` (with `/metrics` on the
/// main listener): grants with a generated token, a token in the body and
/// one in `Lock-Token`; a 409; a wait that ends in a grant; extends and
/// releases by header and by body; a wrong token; a GET; a token in the URL;
/// a bad body; an invalid lock name; an unknown route; `/metrics` and
/// `/readyz`. One request carries `x-request-id: trace-me-42`.
async fn full_workload(w: &mut Workload<'_>) {
    use Method as M;
    fn post<'b>(
        path: &'b str,
        lock: &'static str,
        headers: &'b [(&'b str, &'b str)],
        body: Option<String>,
    ) -> Ask<'b> {
        Ask {
            method: Method::POST,
            path,
            route: "/locks/{name}",
            lock: Some(lock),
            headers,
            body,
        }
    }

    // Grants: generated token, client token in the body, in the header.
    let a = w
        .send(post("/locks/logs:gen", "logs:gen", &[], None), 201)
        .await;
    let generated = a.json()["token"].as_str().unwrap().to_owned();
    let in_body = w.token();
    w.send(
        post(
            "/locks/logs:body",
            "logs:body",
            &[],
            body(&json!({ "token": in_body, "ttl_ms": 30_000, "owner": "worker-1" })),
        ),
        201,
    )
    .await;
    let in_header = w.token();
    w.send(
        post(
            "/locks/logs:hdr",
            "logs:hdr",
            &[("Lock-Token", in_header.as_str())],
            None,
        ),
        201,
    )
    .await;

    // Held: 409.
    let other = w.token();
    w.send(
        post(
            "/locks/logs:gen",
            "logs:gen",
            &[],
            body(&json!({ "token": other })),
        ),
        409,
    )
    .await;

    // A waiter that gets the lock once it is released.
    let wait_ask = post(
        "/locks/logs:gen",
        "logs:gen",
        &[],
        body(&json!({ "wait_ms": 20_000 })),
    );
    let waiting = {
        let request = w.request(&wait_ask);
        tokio::spawn(async move { Answer::read(request.send().await.unwrap()).await.unwrap() })
    };
    until_metric(
        &w.http,
        &w.lockd.url("/metrics"),
        "lockd_waiters",
        &[("namespace", "logs")],
        1.0,
        Duration::from_secs(10),
    )
    .await;
    w.send(
        Ask {
            method: M::DELETE,
            path: "/locks/logs:gen",
            route: "/locks/{name}",
            lock: Some("logs:gen"),
            headers: &[("Lock-Token", generated.as_str())],
            body: None,
        },
        204,
    )
    .await;
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter was not granted within 10 s of the release")
        .expect("waiter task");
    assert_eq!(granted.status, StatusCode::CREATED, "{granted:?}");
    w.record(&wait_ask, &granted);
    let waited = granted.json()["token"].as_str().unwrap().to_owned();

    // Extend by header and by body.
    w.send(
        Ask {
            method: M::PATCH,
            path: "/locks/logs:gen",
            route: "/locks/{name}",
            lock: Some("logs:gen"),
            headers: &[("Lock-Token", waited.as_str())],
            body: body(&json!({ "ttl_ms": 20_000 })),
        },
        200,
    )
    .await;
    w.send(
        Ask {
            method: M::PATCH,
            path: "/locks/logs:body",
            route: "/locks/{name}",
            lock: Some("logs:body"),
            headers: &[],
            body: body(&json!({ "token": in_body, "ttl_ms": 20_000 })),
        },
        200,
    )
    .await;

    // A release with a wrong token.
    let wrong = w.token();
    w.send(
        Ask {
            method: M::DELETE,
            path: "/locks/logs:hdr",
            route: "/locks/{name}",
            lock: Some("logs:hdr"),
            headers: &[("Lock-Token", wrong.as_str())],
            body: None,
        },
        409,
    )
    .await;

    // A GET, traced by the client's request ID.
    let traced = w
        .send(
            Ask {
                method: M::GET,
                path: "/locks/logs:gen",
                route: "/locks/{name}",
                lock: Some("logs:gen"),
                headers: &[("x-request-id", "trace-me-42")],
                body: None,
            },
            200,
        )
        .await;
    assert_eq!(
        traced.header("x-request-id").as_deref(),
        Some("trace-me-42")
    );

    // A token in the URL is refused (and must not be logged).
    let path = format!("/locks/logs:gen?token={waited}");
    w.send(
        Ask {
            method: M::DELETE,
            path: &path,
            route: "/locks/{name}",
            // The layer that refuses a token in the URL runs before the
            // handler records the lock name, so this line names no lock.
            lock: None,
            headers: &[],
            body: None,
        },
        400,
    )
    .await
    .expect_problem(400, "invalid-request");

    // Bad bodies: cut-off JSON with a token in it; a token where a number
    // should be (the problem's detail may quote it back, the log must not).
    let cut = w.token();
    w.send(
        post(
            "/locks/logs:bad",
            "logs:bad",
            &[],
            Some(format!(r#"{{"token":"{cut}","ttl_ms":"#)),
        ),
        400,
    )
    .await
    .expect_problem(400, "invalid-request");
    let misplaced = w.token();
    w.send(
        post(
            "/locks/logs:bad",
            "logs:bad",
            &[],
            body(&json!({ "ttl_ms": misplaced })),
        ),
        400,
    )
    .await
    .expect_problem(400, "invalid-request");
    // A malformed token (too short, so not a token lockd would take) is
    // refused too.
    w.send(
        Ask {
            method: M::PATCH,
            path: "/locks/logs:gen",
            route: "/locks/{name}",
            lock: Some("logs:gen"),
            headers: &[("Lock-Token", "short!")],
            body: None,
        },
        400,
    )
    .await;

    // An invalid lock name, and an unknown route.
    w.send(
        Ask {
            method: M::GET,
            path: "/locks/bad%20name",
            route: "/locks/{name}",
            lock: None,
            headers: &[],
            body: None,
        },
        400,
    )
    .await;
    w.send(
        Ask {
            method: M::GET,
            path: "/no/such/route",
            route: "unmatched",
            lock: None,
            headers: &[],
            body: None,
        },
        404,
    )
    .await;

    // Releases by body and by header.
    w.send(
        Ask {
            method: M::DELETE,
            path: "/locks/logs:body",
            route: "/locks/{name}",
            lock: Some("logs:body"),
            headers: &[],
            body: body(&json!({ "token": in_body })),
        },
        204,
    )
    .await;
    for (path, lock, token) in [
        ("/locks/logs:gen", "logs:gen", waited.as_str()),
        ("/locks/logs:hdr", "logs:hdr", in_header.as_str()),
    ] {
        w.send(
            Ask {
                method: M::DELETE,
                path,
                route: "/locks/{name}",
                lock: Some(lock),
                headers: &[("Lock-Token", token)],
                body: None,
            },
            204,
        )
        .await;
    }

    // A semaphore's permits: one under a client token in the body, one
    // under a token lockd generates; extended, then given back.
    let permit = w.token();
    w.send(
        Ask {
            method: M::POST,
            path: "/semaphores/logs:pool",
            route: "/semaphores/{name}",
            lock: None,
            headers: &[],
            body: body(&json!({ "limit": 2, "token": permit })),
        },
        201,
    )
    .await;
    let second = w
        .send(
            Ask {
                method: M::POST,
                path: "/semaphores/logs:pool?limit=2",
                route: "/semaphores/{name}",
                lock: None,
                headers: &[],
                body: None,
            },
            201,
        )
        .await;
    let generated = serde_json::from_str::<Value>(&second.text)
        .ok()
        .and_then(|g| g["token"].as_str().map(str::to_owned))
        .unwrap_or_default();
    for token in [permit.as_str(), generated.as_str()] {
        for (method, status) in [(M::PATCH, 200), (M::DELETE, 204)] {
            w.send(
                Ask {
                    method,
                    path: "/semaphores/logs:pool",
                    route: "/semaphores/{name}",
                    lock: None,
                    headers: &[("Lock-Token", token)],
                    body: None,
                },
                status,
            )
            .await;
        }
    }

    // Operations routes.
    for path in ["/metrics", "/readyz"] {
        w.send(
            Ask {
                method: M::GET,
                path,
                route: path,
                lock: None,
                headers: &[],
                body: None,
            },
            200,
        )
        .await;
    }
}

/// Asserts that no token of `tokens` is anywhere in `logs`.
fn assert_no_token(logs: &str, tokens: &[String]) {
    assert!(tokens.len() >= 8, "too few tokens collected: {tokens:?}");
    for token in tokens {
        if let Some(line) = logs.lines().find(|l| l.contains(token.as_str())) {
            panic!("a token is in the logs, on this line:\n{line}");
        }
    }
}

/// Stops lockd with SIGTERM and returns its logs, after checking that it
/// exited 0.
async fn stop(lockd: &mut Lockd) -> String {
    lockd.signal(Signal::SIGTERM);
    let exit = lockd.exited_within(Duration::from_secs(15)).await;
    let logs = lockd.stderr();
    let exit = exit.unwrap_or_else(|| panic!("lockd did not exit on SIGTERM:\n{logs}"));
    assert_eq!(exit.code(), Some(0), "{exit}; logs:\n{logs}");
    logs
}

/// With `--log-format json` and everything logged (`trace`): every line is a
/// JSON object; every request has its `lockd::access` line, whose span
/// names the method, route, lock, request ID, status, result and latency;
/// and no token is logged anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_of_a_full_workload_name_no_token() {
    let redis = RedisServer::spawn().await;
    let mut lockd = Lockd::serve(
        &["--redis-url", &redis.url(), "--log-format", "json"],
        &[("LOCKD_LOG", "trace")],
    )
    .await;
    let mut w = Workload::new(&lockd);
    full_workload(&mut w).await;
    let Workload { sent, tokens, .. } = w;
    let logs = stop(&mut lockd).await;

    assert_no_token(&logs, &tokens);

    let mut lines = Vec::new();
    for (i, line) in logs.lines().enumerate() {
        let value: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("log line {} is not JSON ({e}):\n{line}", i + 1));
        assert!(
            value.is_object(),
            "log line {} is not an object: {line}",
            i + 1
        );
        lines.push(value);
    }
    let access: Vec<&Value> = lines
        .iter()
        .filter(|l| l["target"] == "lockd::access")
        .collect();
    assert!(
        access.len() >= sent.len(),
        "{} access lines for {} requests",
        access.len(),
        sent.len()
    );
    for line in &access {
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(line["fields"]["message"], "answered", "{line}");
        let span = &line["span"];
        assert_eq!(span["name"], "request", "{line}");
        for field in ["method", "route", "request_id", "result"] {
            assert!(span[field].is_string(), "no {field} in {line}");
        }
        assert!(span["status"].is_u64(), "no status in {line}");
        assert!(
            span["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
            "no latency_ms in {line}"
        );
    }
    for request in &sent {
        let mine: Vec<&&Value> = access
            .iter()
            .filter(|l| l["span"]["request_id"] == request.request_id.as_str())
            .collect();
        assert_eq!(
            mine.len(),
            1,
            "access lines of {request:?}: {mine:#?}\nall logs:\n{logs}"
        );
        let span = &mine[0]["span"];
        assert_eq!(
            span["method"],
            request.method.as_str(),
            "{request:?}: {span}"
        );
        assert_eq!(span["route"], request.route, "{request:?}: {span}");
        assert_eq!(span["status"], request.status, "{request:?}: {span}");
        assert_eq!(
            span["result"],
            request.result.as_str(),
            "{request:?}: {span}"
        );
        if let Some(lock) = request.lock {
            assert_eq!(span["lock"], lock, "{request:?}: {span}");
        }
        if request.route == "/semaphores/{name}" {
            assert_eq!(span["semaphore"], "logs:pool", "{request:?}: {span}");
        }
    }
    assert!(
        sent.iter()
            .filter(|s| s.route == "/semaphores/{name}")
            .count()
            >= 6,
        "the semaphore requests were not sent"
    );
    assert!(
        sent.iter().any(|s| s.request_id == "trace-me-42"),
        "the traced request was not sent"
    );
    // Generated request IDs are UUIDs.
    let generated = sent
        .iter()
        .filter(|s| s.request_id != "trace-me-42")
        .inspect(|s| {
            assert!(
                s.request_id.len() == 36 && s.request_id.matches('-').count() == 4,
                "not a UUID: {s:?}"
            );
        })
        .count();
    assert!(generated > 10);
}

/// The access log names a lock by its name as parsed: `logs%3Apct` and
/// `logs:pct` are the same lock, and both lines say `logs:pct`, in either
/// log format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_names_a_percent_encoded_lock_by_its_decoded_name() {
    let redis = RedisServer::spawn().await;
    for format in ["json", "pretty"] {
        let mut lockd = Lockd::serve(
            &["--redis-url", &redis.url(), "--log-format", format],
            &[("LOCKD_LOG", "info")],
        )
        .await;
        let client = http_client(Duration::from_secs(5));
        let grant = client
            .post(lockd.url("/locks/logs%3Apct"))
            .header("x-request-id", "pct-acquire")
            .send()
            .await
            .unwrap();
        assert_eq!(grant.status(), StatusCode::CREATED);
        let token = grant.json::<Value>().await.unwrap()["token"]
            .as_str()
            .unwrap()
            .to_owned();
        let released = client
            .delete(lockd.url("/locks/logs:pct"))
            .header("x-request-id", "pct-release")
            .header("Lock-Token", &token)
            .send()
            .await
            .unwrap();
        assert_eq!(released.status(), StatusCode::NO_CONTENT);
        // Refused before its handler runs: still named as parsed.
        let refused = client
            .get(lockd.url("/locks/logs%3apct?token=x"))
            .header("x-request-id", "pct-refused")
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
        let logs = stop(&mut lockd).await;
        for id in ["pct-acquire", "pct-release", "pct-refused"] {
            let line = logs
                .lines()
                .find(|l| l.contains(id) && l.contains("lockd::access"))
                .unwrap_or_else(|| panic!("{format}: no access line for {id}:\n{logs}"));
            let lock = if format == "json" {
                let line: Value = serde_json::from_str(line).unwrap();
                line["span"]["lock"].as_str().unwrap_or_default().to_owned()
            } else {
                line.split("lock=\"")
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or_default()
                    .to_owned()
            };
            assert_eq!(lock, "logs:pct", "{format}, {id}: {line}");
        }
        assert!(
            !logs.contains("%3"),
            "{format}: a raw name was logged:\n{logs}"
        );
    }
}

/// The same with the default (pretty) format: no token is logged, and the
/// access lines name the request ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_in_pretty_format_name_no_token() {
    let redis = RedisServer::spawn().await;
    let mut lockd = Lockd::serve(&["--redis-url", &redis.url()], &[("LOCKD_LOG", "trace")]).await;
    let mut w = Workload::new(&lockd);
    full_workload(&mut w).await;
    let Workload { sent, tokens, .. } = w;
    let logs = stop(&mut lockd).await;

    assert_no_token(&logs, &tokens);
    for request in &sent {
        let id = format!("request_id=\"{}\"", request.request_id);
        let line = logs
            .lines()
            .find(|l| l.contains(&id) && l.contains("lockd::access") && l.contains("answered"))
            .unwrap_or_else(|| panic!("no access line for {request:?}:\n{logs}"));
        assert!(
            line.contains(&format!("status={}", request.status)),
            "{request:?}: {line}"
        );
        assert!(
            line.contains(&format!("result=\"{}\"", request.result)),
            "{request:?}: {line}"
        );
        if let Some(lock) = request.lock {
            assert!(
                line.contains(&format!("lock=\"{lock}\"")),
                "{request:?}: {line}"
            );
        }
    }
}

/// With API keys on, the access line names the key, also for a waiter
/// whose client went away (499, `client-closed`), in either log format; a
/// request refused for an unknown key is logged without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_line_names_the_key_also_for_a_client_that_went_away() {
    use lockd::auth::Permission;
    let redis = RedisServer::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    let secret = format!("secret-{}", random_token());
    let entry = crate::support::key_entry(
        "logs-ops",
        &secret,
        &["*"],
        &[Permission::Acquire, Permission::Release],
        None,
    );
    std::fs::write(&keys, entry).unwrap();
    let bearer = format!("Bearer {secret}");
    for format in ["json", "pretty"] {
        let mut lockd = Lockd::serve(
            &[
                "--redis-url",
                &redis.url(),
                "--log-format",
                format,
                "--auth-keys-file",
                keys.to_str().unwrap(),
            ],
            &[("LOCKD_LOG", "info")],
        )
        .await;
        let name = format!("logs:keyed:{format}");
        let held = http_client(Duration::from_secs(5))
            .post(lockd.url(&format!("/locks/{name}")))
            .header("authorization", &bearer)
            .header("x-request-id", "keyed-held")
            .send()
            .await
            .unwrap();
        assert_eq!(held.status(), StatusCode::CREATED);
        let gone = http_client(Duration::from_millis(300))
            .post(lockd.url(&format!("/locks/{name}?wait_ms=10000")))
            .header("authorization", &bearer)
            .header("x-request-id", "keyed-gone")
            .send()
            .await;
        assert!(gone.is_err(), "the wait was answered: {gone:?}");
        let unknown = http_client(Duration::from_secs(5))
            .post(lockd.url(&format!("/locks/{name}")))
            .header("authorization", "Bearer not-a-key")
            .header("x-request-id", "keyed-unknown")
            .send()
            .await
            .unwrap();
        assert_eq!(unknown.status(), StatusCode::UNAUTHORIZED);
        // The 499 is logged once lockd sees the connection closed.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !lockd.stderr().contains("keyed-gone") {
            assert!(
                Instant::now() < deadline,
                "no line for the waiter that went away"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let logs = stop(&mut lockd).await;
        let access = |id: &str| {
            logs.lines()
                .find(|l| l.contains(id) && l.contains("lockd::access"))
                .unwrap_or_else(|| panic!("{format}: no access line for {id}:\n{logs}"))
                .to_owned()
        };
        for (id, status, result, key) in [
            ("keyed-held", 201, "ok", Some("logs-ops")),
            ("keyed-gone", 499, "client-closed", Some("logs-ops")),
            ("keyed-unknown", 401, "unauthorized", None),
        ] {
            let line = access(id);
            if format == "json" {
                let span = serde_json::from_str::<Value>(&line).unwrap()["span"].clone();
                assert_eq!(span["status"], status, "{line}");
                assert_eq!(span["result"], result, "{line}");
                assert_eq!(span["key"].as_str(), key, "{line}");
            } else {
                assert!(line.contains(&format!(" status={status} ")), "{line}");
                assert!(line.contains(&format!(" result=\"{result}\"")), "{line}");
                match key {
                    Some(key) => assert!(line.contains(&format!(" key=\"{key}\" ")), "{line}"),
                    None => assert!(!line.contains(" key="), "{line}"),
                }
            }
        }
        assert!(
            !logs.contains(&secret),
            "{format}: the key's secret was logged"
        );
    }
}
