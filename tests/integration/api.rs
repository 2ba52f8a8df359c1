//! HTTP conformance of `/locks/{name}` and the operational routes, run
//! against both backends (`redis::*` and `memory::*`): validation and
//! problem documents, renewals and fences, mutual exclusion under
//! contention, and metrics. The Redis data model has its own Redis-only test.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::support::{
    TestApp, assert_lease_ms, assert_pttl_since, backend_tests, eventually, lock_key, metric,
    ms_until, random_token, samples,
};
use futures::future::join_all;
use reqwest::Method;
use serde_json::json;

backend_tests!(
    bad_lock_names_are_refused_with_a_problem_and_write_nothing,
    malformed_requests_are_refused_with_problems_and_write_nothing,
    oversized_bodies_are_413_problems_and_write_nothing,
    unknown_routes_and_methods_are_problems,
    boundary_values_and_query_forms_are_accepted,
    reacquire_with_own_token_renews_with_same_fence_and_resets_ttl,
    reacquire_with_own_token_and_an_owner_replaces_the_owner_keeps_granted_at,
    fences_grow_across_grants_releases_and_expiries,
    inspect_shows_owner_and_fence_but_never_the_token,
    extend_and_release_take_the_token_from_the_body_too,
    contended_acquire_says_when_to_retry,
    mutual_exclusion_holds_among_16_contending_clients,
    metrics_count_outcomes_by_result_and_route_template,
    healthz_and_readyz_answer_while_the_store_is_up,
    a_token_given_twice_is_refused_and_changes_nothing,
    bodies_must_be_json_objects_and_uncompressed,
    a_lock_token_header_on_acquire_chooses_the_token,
    a_token_in_any_url_is_refused,
    a_declared_oversized_body_is_refused_before_it_is_sent,
    unknown_methods_share_one_metric_label,
    reacquire_with_a_new_owner_label_updates_it,
    a_json_null_body_is_refused_and_an_absent_one_is_not,
    a_field_the_route_does_not_take_is_named_unknown_whatever_its_value,
    a_field_name_that_may_not_be_echoed_is_not,
);

/// Requests that must be refused before the store is touched.
struct Refusal {
    method: Method,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Option<String>,
    status: u16,
    slug: &'static str,
}

impl Refusal {
    fn new(method: Method, path: impl Into<String>, status: u16, slug: &'static str) -> Self {
        Self {
            method,
            path: path.into(),
            headers: Vec::new(),
            body: None,
            status,
            slug,
        }
    }

    fn token(mut self, token: &str) -> Self {
        self.headers.push(("Lock-Token", token.to_owned()));
        self
    }

    fn body(mut self, body: impl Into<String>) -> Self {
        self.headers
            .push(("Content-Type", "application/json".to_owned()));
        self.body = Some(body.into());
        self
    }

    fn bad(method: Method, path: impl Into<String>) -> Self {
        Self::new(method, path, 400, "invalid-request")
    }
}

/// What the store holds and how often it was called.
#[derive(Debug, PartialEq)]
struct Snapshot {
    lock_keys: usize,
    redis_keys: Option<Vec<String>>,
    backend_calls: u64,
}

async fn snapshot(app: &TestApp) -> Snapshot {
    Snapshot {
        lock_keys: app.lock_key_count().await,
        redis_keys: match app.is_redis() {
            true => Some(app.redis_server().keys().await),
            false => None,
        },
        backend_calls: app.backend_calls().await,
    }
}

/// Sends every refusal, checks each answer is the expected problem
/// document, and that neither the store nor Redis's script counters moved.
async fn assert_all_refused(app: &TestApp, refusals: Vec<Refusal>) {
    let before = snapshot(app).await;
    if app.is_redis() {
        app.redis_server().reset_stats().await;
    }
    for r in &refusals {
        let headers: Vec<(&str, &str)> = r.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let reply = app
            .send(
                r.method.clone(),
                &r.path,
                &headers,
                r.body.clone().map(String::into_bytes),
            )
            .await;
        assert_eq!(
            reply.status.as_u16(),
            r.status,
            "{} {} body {:?} -> {}",
            r.method,
            r.path,
            r.body.as_deref().map(|b| &b[..b.len().min(80)]),
            reply.text
        );
        reply.expect_problem(r.status, r.slug);
    }
    if app.is_redis() {
        assert_eq!(
            app.redis_server().script_calls().await,
            0,
            "a refused request reached Redis"
        );
    }
    assert_eq!(snapshot(app).await, before, "a refused request wrote");
}

async fn bad_lock_names_are_refused_with_a_problem_and_write_nothing(app: &TestApp) {
    let token = random_token();
    let long = "x".repeat(201);
    let names = [
        "a%20b",   // space
        "%7Bx%7D", // braces: the Redis hash tag
        "a%7Db",   // a closing brace alone
        long.as_str(),
        "a%0Ab",  // percent-encoded newline
        "a%00b",  // NUL
        "a%2Fb",  // slash
        "%C3%A9", // é
        "a*b",    // glob characters
        "a%3Fb",  // ?
    ];
    let mut refusals = Vec::new();
    for name in names {
        let path = format!("/locks/{name}");
        refusals.push(Refusal::bad(Method::POST, &path));
        refusals.push(Refusal::bad(Method::POST, &path).body(r#"{"ttl_ms":1000}"#));
        refusals.push(Refusal::bad(Method::PATCH, &path).token(&token));
        refusals.push(Refusal::bad(Method::DELETE, &path).token(&token));
        refusals.push(Refusal::bad(Method::GET, &path));
    }
    assert_all_refused(app, refusals).await;
}

async fn malformed_requests_are_refused_with_problems_and_write_nothing(app: &TestApp) {
    let held = app
        .acquire("v:held", Some(json!({ "ttl_ms": 30_000, "owner": "a" })))
        .await;
    held.expect_status(201);
    let tok = held.token();
    let (_, pttl_before) = app.holder("v:held").await.expect("held");
    let (free, mine) = ("/locks/v:free", "/locks/v:held");
    let long_owner = "o".repeat(257);
    use Method as M;
    let refusals = vec![
        // Unknown members and parameters.
        Refusal::bad(M::POST, free).body(r#"{"ttl_ms":1000,"color":"red"}"#),
        Refusal::bad(M::POST, free).body(r#"{"ttl":1000}"#),
        Refusal::bad(M::POST, format!("{free}?color=red")),
        Refusal::bad(M::PATCH, mine).body(format!(r#"{{"token":"{tok}","extra":1}}"#)),
        Refusal::bad(M::PATCH, format!("{mine}?owner=x")).token(&tok),
        Refusal::bad(M::DELETE, mine).body(format!(r#"{{"token":"{tok}","ttl_ms":5}}"#)),
        Refusal::bad(M::DELETE, format!("{mine}?ttl_ms=5")).token(&tok),
        Refusal::bad(M::GET, format!("{mine}?ttl_ms=5")),
        // A token in the URL, on every route.
        Refusal::bad(M::POST, format!("{free}?token={tok}")),
        Refusal::bad(M::POST, format!("{mine}?ttl_ms=1000&token={tok}")),
        Refusal::bad(M::PATCH, format!("{mine}?token={tok}")),
        Refusal::bad(M::DELETE, format!("{mine}?token={tok}")),
        Refusal::bad(M::GET, format!("{mine}?token={tok}")),
        // The same parameter in the query and in the body.
        Refusal::bad(M::POST, format!("{free}?ttl_ms=1000")).body(r#"{"ttl_ms":1000}"#),
        Refusal::bad(M::POST, format!("{free}?owner=a")).body(r#"{"owner":"a"}"#),
        Refusal::bad(M::PATCH, format!("{mine}?ttl_ms=1000"))
            .body(format!(r#"{{"token":"{tok}","ttl_ms":1000}}"#)),
        // The token in the header and in the body.
        Refusal::bad(M::PATCH, mine)
            .token(&tok)
            .body(format!(r#"{{"token":"{tok}"}}"#)),
        Refusal::bad(M::DELETE, mine)
            .token(&tok)
            .body(format!(r#"{{"token":"{tok}"}}"#)),
        // Malformed tokens and owners.
        Refusal::bad(M::POST, free).body(r#"{"token":"short"}"#),
        Refusal::bad(M::POST, free).body(r#"{"token":"abcdefghijklmnop!"}"#),
        Refusal::bad(M::POST, free).body(format!(r#"{{"token":"{}"}}"#, "a".repeat(129))),
        Refusal::bad(M::PATCH, mine).token("short"),
        Refusal::bad(M::DELETE, mine).token("abcdefghijklmnop!"),
        Refusal::bad(M::POST, free).body(format!(r#"{{"owner":"{long_owner}"}}"#)),
        Refusal::bad(M::POST, free).body(r#"{"owner":"a\nb"}"#),
        Refusal::bad(M::POST, format!("{free}?owner=a%0Ab")),
        // Malformed JSON, and JSON that is not an object.
        Refusal::bad(M::POST, free).body(r#"{"ttl_ms":"#),
        Refusal::bad(M::POST, free).body("not json"),
        Refusal::bad(M::POST, free).body("[]"),
        Refusal::bad(M::POST, free).body(r#""x""#),
        Refusal::bad(M::POST, free).body(r#"{"ttl_ms":1000}{"ttl_ms":1}"#),
        Refusal::bad(M::PATCH, mine).token(&tok).body("{"),
        Refusal::bad(M::DELETE, mine).token(&tok).body("[1]"),
    ];
    assert_all_refused(app, refusals).await;
    let (holder, pttl_after) = app.holder("v:held").await.expect("still held");
    assert_eq!(holder, tok);
    assert!(pttl_after <= pttl_before, "{pttl_before} -> {pttl_after}");
    assert_eq!(app.holder("v:free").await, None);
}

async fn oversized_bodies_are_413_problems_and_write_nothing(app: &TestApp) {
    let held = app.acquire_ttl("big:held", 30_000).await;
    held.expect_status(201);
    let tok = held.token();
    let padding = " ".repeat(65 * 1024);
    let big = format!(r#"{{"ttl_ms":1000{padding}}}"#);
    let big_owner = format!(r#"{{"owner":"{}"}}"#, "o".repeat(70_000));
    let refusals = vec![
        Refusal::new(Method::POST, "/locks/big:free", 413, "payload-too-large").body(&*big),
        Refusal::new(Method::POST, "/locks/big:free", 413, "payload-too-large").body(big_owner),
        Refusal::new(Method::PATCH, "/locks/big:held", 413, "payload-too-large")
            .token(&tok)
            .body(&*big),
        Refusal::new(Method::DELETE, "/locks/big:held", 413, "payload-too-large")
            .token(&tok)
            .body(&*big),
    ];
    assert_all_refused(app, refusals).await;
    assert_eq!(app.holder_token("big:held").await, Some(tok));
    // Just under the limit is fine.
    let fits = format!(r#"{{"ttl_ms":1000{}}}"#, " ".repeat(65 * 1024 - 20));
    let reply = app
        .send(
            Method::POST,
            "/locks/big:fits",
            &[("Content-Type", "application/json")],
            Some(fits.into_bytes()),
        )
        .await;
    reply.expect_status(201);
}

async fn unknown_routes_and_methods_are_problems(app: &TestApp) {
    let refusals = vec![
        Refusal::new(Method::GET, "/nope", 404, "route-not-found"),
        Refusal::new(Method::POST, "/locks", 405, "method-not-allowed"),
        Refusal::new(Method::DELETE, "/semaphores", 405, "method-not-allowed"),
        Refusal::new(Method::GET, "/locks/", 404, "route-not-found"),
        Refusal::new(Method::POST, "/locks/a/b", 400, "invalid-request"),
        Refusal::new(Method::PUT, "/locks/k", 405, "method-not-allowed"),
        Refusal::new(Method::POST, "/healthz", 405, "method-not-allowed"),
        Refusal::new(Method::DELETE, "/metrics", 405, "method-not-allowed"),
    ];
    assert_all_refused(app, refusals).await;
    let reply = app.send(Method::PUT, "/locks/k", &[], None).await;
    reply.expect_problem(405, "method-not-allowed");
    let allow: BTreeSet<String> = reply
        .header("allow")
        .expect("405 names the allowed methods")
        .split(',')
        .map(|m| m.trim().to_owned())
        .collect();
    for method in ["GET", "POST", "PATCH", "DELETE"] {
        assert!(allow.contains(method), "Allow: {allow:?}");
    }
}

async fn boundary_values_and_query_forms_are_accepted(app: &TestApp) {
    // The longest name, with every character of the alphabet.
    let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-:@";
    let longest = format!("{alphabet}{}", "z".repeat(200 - alphabet.len()));
    let sent = Instant::now();
    let a = app.acquire_ttl(&longest, 3_600_000).await;
    a.expect_status(201);
    assert_eq!(a.str("name"), longest);
    assert_lease_ms(Some(a.u64("ttl_ms")), 3_600_000, sent);
    let (holder, pttl) = app.holder(&longest).await.expect("held");
    assert_eq!(holder, a.token());
    assert_pttl_since(pttl, 3_600_000, sent);
    // A 1 ms lease is over before its answer arrives unless the round trip
    // took under a millisecond: then the lease is gone (404). Redlock
    // reports the validity, ttl − elapsed − drift, so a 1 ms extend always
    // has none left there.
    let tiny = app.extend_ttl(&longest, &a.token(), 1).await;
    if app.is_redlock() || tiny.status != 200 {
        tiny.expect_problem(404, "lock-not-held");
    }

    // ttl_ms and owner in the query string, for curl.
    let sent = Instant::now();
    let q = app
        .send(
            Method::POST,
            "/locks/q:1?ttl_ms=1500&owner=cli-1",
            &[],
            None,
        )
        .await;
    q.expect_status(201);
    assert_lease_ms(Some(q.u64("ttl_ms")), 1500, sent);
    let (_, pttl) = app.holder("q:1").await.expect("held");
    assert_pttl_since(pttl, 1500, sent);
    assert_eq!(app.inspect("q:1").await.str("owner"), "cli-1");
    let sent = Instant::now();
    let e = app
        .send(
            Method::PATCH,
            "/locks/q:1?ttl_ms=2500",
            &[("Lock-Token", &q.token())],
            None,
        )
        .await;
    e.expect_status(200);
    assert_lease_ms(Some(e.u64("ttl_ms")), 2500, sent);
    let (_, pttl) = app.holder("q:1").await.expect("held");
    assert_pttl_since(pttl, 2500, sent);

    // No body at all: the default TTL (30 s).
    let sent = Instant::now();
    let d = app.acquire("q:default", None).await;
    d.expect_status(201);
    assert_lease_ms(Some(d.u64("ttl_ms")), 30_000, sent);
    let (_, pttl) = app.holder("q:default").await.expect("held");
    assert_pttl_since(pttl, 30_000, sent);
    let sent = Instant::now();
    let e = app.extend("q:default", &d.token(), None).await;
    e.expect_status(200);
    assert_lease_ms(Some(e.u64("ttl_ms")), 30_000, sent);

    // A JSON body is read whatever its Content-Type (curl -d).
    let sent = Instant::now();
    let f = app
        .send(
            Method::POST,
            "/locks/q:form",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            Some(br#"{"ttl_ms":4000}"#.to_vec()),
        )
        .await;
    f.expect_status(201);
    assert_lease_ms(Some(f.u64("ttl_ms")), 4000, sent);

    // A client-chosen token of 16 and of 128 characters.
    for len in [16, 128] {
        let token = "t".repeat(len);
        let name = format!("q:tok{len}");
        let r = app
            .acquire(&name, Some(json!({ "token": token, "ttl_ms": 5000 })))
            .await;
        r.expect_status(201);
        assert_eq!(r.token(), token);
        assert_eq!(app.holder_token(&name).await, Some(token.clone()));
        app.release(&name, &token).await.expect_status(204);
    }
}

async fn reacquire_with_own_token_renews_with_same_fence_and_resets_ttl(app: &TestApp) {
    let name = "re:k";
    let token = random_token();
    let first = app
        .acquire(
            name,
            Some(json!({ "token": token, "ttl_ms": 2000, "owner": "w1" })),
        )
        .await;
    first.expect_status(201);
    assert_eq!(first.token(), token);
    let fence = first.fence();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, pttl) = app.holder(name).await.expect("held");
    assert!(pttl < 1750, "PTTL {pttl} after 300 ms of 2000");

    let sent = Instant::now();
    let again = app
        .acquire(name, Some(json!({ "token": token, "ttl_ms": 5000 })))
        .await;
    again.expect_status(200);
    assert_eq!(again.token(), token);
    assert_eq!(again.fence(), fence, "a renewal must keep the fence");
    assert_lease_ms(Some(again.u64("ttl_ms")), 5000, sent);
    let (holder, pttl) = app.holder(name).await.expect("held");
    assert_eq!(holder, token);
    assert_pttl_since(pttl, 5000, sent);

    app.acquire_ttl(name, 5000)
        .await
        .expect_problem(409, "lock-held");
    let status = app.inspect(name).await;
    assert_eq!(status.fence(), fence);
    assert_eq!(status.str("owner"), "w1");

    app.release(name, &token).await.expect_status(204);
    let next = app
        .acquire(name, Some(json!({ "token": token, "ttl_ms": 5000 })))
        .await;
    next.expect_status(201);
    assert!(next.fence() > fence, "a new grant needs a new fence");
}

/// docs/api.md's promise for a 200 renewal: `owner` is replaced when the
/// request gives one; the fence and `granted_at` stay the first grant's.
async fn reacquire_with_own_token_and_an_owner_replaces_the_owner_keeps_granted_at(app: &TestApp) {
    let name = "re:owner";
    let token = random_token();
    app.acquire(
        name,
        Some(json!({ "token": token, "ttl_ms": 5000, "owner": "w1" })),
    )
    .await
    .expect_status(201);
    let before = app.inspect(name).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    app.acquire(
        name,
        Some(json!({ "token": token, "ttl_ms": 5000, "owner": "w2" })),
    )
    .await
    .expect_status(200);
    let after = app.inspect(name).await;
    assert_eq!(after.str("owner"), "w2");
    assert_eq!(after.fence(), before.fence());
    assert_eq!(after.str("granted_at"), before.str("granted_at"));
    app.release(name, &token).await.expect_status(204);
}

async fn fences_grow_across_grants_releases_and_expiries(app: &TestApp) {
    let name = "fence:k";
    let mut fences = Vec::new();
    for _ in 0..5 {
        let r = app.acquire_ttl(name, 5000).await;
        r.expect_status(201);
        fences.push(r.fence());
        app.release(name, &r.token()).await.expect_status(204);
    }
    // Grants that end by expiry: each waits until the lease ran out, a
    // lease long enough that a slow answer still finds some left.
    for _ in 0..3 {
        let r = app.acquire_ttl(name, 300).await;
        r.expect_status(201);
        fences.push(r.fence());
        assert!(
            eventually(Duration::from_secs(10), || async {
                app.inspect(name).await.status == 404
            })
            .await,
            "the lease did not run out"
        );
    }
    let extended = {
        let r = app.acquire_ttl(name, 5000).await;
        r.expect_status(201);
        fences.push(r.fence());
        app.extend_ttl(name, &r.token(), 6000).await
    };
    extended.expect_status(200);
    assert_eq!(
        Some(&extended.fence()),
        fences.last(),
        "extend moved the fence"
    );
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences not strictly increasing: {fences:?}"
    );
    // Each lock has its own counter; every fence stays below 2^53.
    let other = app.acquire_ttl("fence:other", 5000).await;
    other.expect_status(201);
    assert!(other.fence() >= 1);
    assert!(fences.iter().chain([&other.fence()]).all(|f| *f < 1 << 53));
}

async fn inspect_shows_owner_and_fence_but_never_the_token(app: &TestApp) {
    let name = "see:k";
    app.inspect(name).await.expect_problem(404, "lock-not-held");
    let grant = app
        .acquire(
            name,
            Some(json!({ "ttl_ms": 10_000, "owner": "billing-worker-3" })),
        )
        .await;
    grant.expect_status(201);
    let token = grant.token();
    let status = app.inspect(name).await;
    status.expect_status(200);
    assert!(!status.text.contains(&token), "GET shows the token");
    let body = status.json();
    assert_eq!(body["name"], name);
    assert_eq!(body["held"], true);
    assert_eq!(body["owner"], "billing-worker-3");
    assert_eq!(status.fence(), grant.fence());
    let ttl = status.u64("ttl_ms");
    assert!(ttl > 9000 && ttl <= 10_000, "ttl_ms {ttl}");
    let granted = ms_until(&status.str("granted_at"));
    assert!(
        (-5000..=5).contains(&granted),
        "granted_at {granted} ms away"
    );
    let expires = ms_until(&status.str("expires_at"));
    assert!(
        expires > 9000 && expires <= 10_010,
        "expires_at {expires} ms away"
    );
    // Without an owner, `owner` is null.
    app.acquire_ttl("see:anon", 5000).await.expect_status(201);
    assert!(app.inspect("see:anon").await.json()["owner"].is_null());
    // Released: free again.
    app.release(name, &token).await.expect_status(204);
    app.inspect(name).await.expect_problem(404, "lock-not-held");
}

async fn extend_and_release_take_the_token_from_the_body_too(app: &TestApp) {
    let name = "body:k";
    let grant = app.acquire_ttl(name, 3000).await;
    grant.expect_status(201);
    let token = grant.token();
    let sent = Instant::now();
    let e = app
        .send_json(
            Method::PATCH,
            &format!("/locks/{name}"),
            &[],
            Some(json!({ "token": token, "ttl_ms": 7000 })),
        )
        .await;
    e.expect_status(200);
    assert_eq!(e.fence(), grant.fence());
    let (_, pttl) = app.holder(name).await.expect("held");
    assert_pttl_since(pttl, 7000, sent);
    let wrong = app
        .send_json(
            Method::DELETE,
            &format!("/locks/{name}"),
            &[],
            Some(json!({ "token": random_token() })),
        )
        .await;
    wrong.expect_problem(409, "not-lock-owner");
    let r = app
        .send_json(
            Method::DELETE,
            &format!("/locks/{name}"),
            &[],
            Some(json!({ "token": token })),
        )
        .await;
    r.expect_status(204);
    assert!(r.text.is_empty());
    assert_eq!(app.holder(name).await, None);
    assert_eq!(app.lock_key_count().await, 0);
}

async fn contended_acquire_says_when_to_retry(app: &TestApp) {
    let name = "busy:k";
    app.acquire_ttl(name, 2500).await.expect_status(201);
    let reply = app.acquire_ttl(name, 1000).await;
    let problem = reply.expect_problem(409, "lock-held");
    let wait = problem["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(wait > 2400 && wait <= 2500, "retry_after_ms {wait}");
    assert_eq!(reply.header("retry-after").as_deref(), Some("3"));
}

/// 16 clients contend on one name, each taking it 10 times: at most one
/// holds it at any moment, and fences grow in the order of the grants.
async fn mutual_exclusion_holds_among_16_contending_clients(app: &TestApp) {
    const CLIENTS: u64 = 16;
    const HOLDS: usize = 10;
    let name = "mutex:hot";
    let held = Arc::new(AtomicBool::new(false));
    let fences = Arc::new(std::sync::Mutex::new(Vec::new()));
    let clients = (0..CLIENTS).map(|client| {
        let (held, fences) = (held.clone(), fences.clone());
        async move {
            let mut holds = 0;
            let mut attempts = 0u64;
            while holds < HOLDS {
                attempts += 1;
                let r = app.acquire_ttl(name, 10_000).await;
                match r.status.as_u16() {
                    201 => {
                        assert!(
                            !held.swap(true, Ordering::SeqCst),
                            "client {client} was granted the lock while another held it"
                        );
                        fences.lock().unwrap().push(r.fence());
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        held.store(false, Ordering::SeqCst);
                        app.release(name, &r.token()).await.expect_status(204);
                        holds += 1;
                    }
                    409 => {
                        let pause = 1 + (client + attempts) % 3;
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                    }
                    other => panic!("client {client}: acquire got {other}: {}", r.text),
                }
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), join_all(clients))
        .await
        .expect("16 clients x 10 holds within 30 s");
    let fences = fences.lock().unwrap().clone();
    assert_eq!(fences.len(), 16 * HOLDS);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences out of grant order: {fences:?}"
    );
    assert_eq!(app.holder(name).await, None);
}

async fn metrics_count_outcomes_by_result_and_route_template(app: &TestApp) {
    let (alpha, beta, gamma) = ("m:secret-alpha", "m:secret-beta", "m:secret-gamma");
    let stranger = random_token();
    let mine = random_token();
    let a = app.acquire_ttl(alpha, 30_000).await;
    a.expect_status(201);
    app.acquire_ttl(beta, 30_000).await.expect_status(201);
    let g = json!({ "token": mine, "ttl_ms": 30_000 });
    app.acquire(gamma, Some(g.clone())).await.expect_status(201);
    app.acquire(gamma, Some(g)).await.expect_status(200);
    for _ in 0..2 {
        app.acquire_ttl(alpha, 1000).await.expect_status(409);
    }
    app.acquire_ttl(alpha, 0).await.expect_status(400);
    app.extend_ttl(alpha, &a.token(), 20_000)
        .await
        .expect_status(200);
    app.extend_ttl(beta, &stranger, 20_000)
        .await
        .expect_status(409);
    app.extend_ttl("m:secret-none", &stranger, 20_000)
        .await
        .expect_status(404);
    app.release(beta, &stranger).await.expect_status(409);
    app.release(alpha, &a.token()).await.expect_status(204);
    app.release(alpha, &a.token()).await.expect_status(404);
    app.inspect(beta).await.expect_status(200);
    app.inspect(alpha).await.expect_status(404);
    app.get("/nope/m-secret-delta").await.expect_status(404);
    app.get("/healthz").await.expect_status(200);

    let text = app.metrics().await;
    let count = |name: &str, labels: &[(&str, &str)]| {
        metric(&text, name, labels).unwrap_or_else(|| panic!("no {name}{labels:?} in\n{text}"))
    };
    let expected_results = [
        ("lockd_acquire_total", "acquired", 3.0),
        ("lockd_acquire_total", "reacquired", 1.0),
        ("lockd_acquire_total", "contended", 2.0),
        ("lockd_acquire_total", "error", 0.0),
        ("lockd_extend_total", "extended", 1.0),
        ("lockd_extend_total", "not_owner", 1.0),
        ("lockd_extend_total", "not_held", 1.0),
        ("lockd_extend_total", "error", 0.0),
        ("lockd_release_total", "released", 1.0),
        ("lockd_release_total", "not_owner", 1.0),
        ("lockd_release_total", "not_held", 1.0),
        ("lockd_release_total", "error", 0.0),
    ];
    for (name, result, value) in expected_results {
        assert_eq!(
            count(name, &[("namespace", "m"), ("result", result)]),
            value,
            "{name}{{namespace=m,result={result}}}"
        );
    }
    let in_m = [("namespace", "m")];
    assert_eq!(count("lockd_acquire_contended_total", &in_m), 2.0);
    // The extend and the release answered 404.
    assert_eq!(count("lockd_lock_expired_total", &in_m), 2.0);
    assert_eq!(count("lockd_lock_hold_seconds_count", &in_m), 1.0);
    assert_eq!(count("lockd_acquire_wait_seconds_count", &in_m), 6.0);
    assert_eq!(count("lockd_http_requests_in_flight", &[]), 1.0);
    // Redlock calls every node, and deletes a refused acquire's grants on
    // every node: its backend calls are per node, not per request.
    let per_request = if app.is_redlock() {
        [].as_slice()
    } else {
        &[
            ("acquire", 6.0),
            ("extend", 3.0),
            ("release", 3.0),
            ("inspect", 2.0),
        ]
    };
    for &(op, calls) in per_request {
        assert_eq!(
            count("lockd_backend_duration_seconds_count", &[("op", op)]),
            calls,
            "backend calls of {op}"
        );
    }
    let route = "/locks/{name}";
    for (method, status, n) in [
        ("POST", "201", 3.0),
        ("POST", "200", 1.0),
        ("POST", "409", 2.0),
        ("POST", "400", 1.0),
        ("PATCH", "200", 1.0),
        ("PATCH", "409", 1.0),
        ("PATCH", "404", 1.0),
        ("DELETE", "204", 1.0),
        ("DELETE", "409", 1.0),
        ("DELETE", "404", 1.0),
        ("GET", "200", 1.0),
        ("GET", "404", 1.0),
    ] {
        let labels = [("method", method), ("route", route), ("status", status)];
        assert_eq!(
            count("lockd_http_requests_total", &labels),
            n,
            "{method} {route} {status}"
        );
    }
    assert_eq!(
        count(
            "lockd_http_requests_total",
            &[("method", "GET"), ("route", "/healthz"), ("status", "200")]
        ),
        1.0
    );
    assert!(
        !text.contains("secret"),
        "a raw lock name or path reached the metrics:\n{text}"
    );
    let templates = [
        "/locks/{name}",
        "/locks/{name}/events",
        "/semaphores/{name}",
        "/semaphores/{name}/events",
        "/runs/{key}",
        "/runs/{key}/result",
        "/runs/{key}/events",
        "/locks/{name}/history",
        "/semaphores/{name}/history",
        "/runs/{key}/history",
        "/locks",
        "/semaphores",
        "/runs",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/docs",
        lockd::http::pages::docs::SCRIPT,
        "/ui",
        "/ui/",
        "/ui/app.js",
        "/ui/app.css",
        "unmatched",
    ];
    for sample in samples(&text) {
        if let Some(route) = sample.labels.get("route") {
            assert!(templates.contains(&route.as_str()), "route label {route:?}");
        }
    }
}

async fn healthz_and_readyz_answer_while_the_store_is_up(app: &TestApp) {
    let health = app.get("/healthz").await;
    health.expect_status(200);
    assert_eq!(health.str("status"), "ok");
    let ready = app.get("/readyz").await;
    ready.expect_status(200);
    assert_eq!(ready.str("status"), "ready");
}

/// A lease shorter than the round trip to Redis (a `ttl_ms` of 1) may run
/// out before Redis's answer arrives: then the answer is a 503 that says
/// so and that nothing is held, not that Redis could not be reached (found
/// by a new-user trial), and the lock is free then. A grant is a 201.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_runs_out_before_the_answer_says_so() {
    let app = TestApp::redis().await;
    for i in 0..50 {
        let name = format!("spent:{i}");
        let r = app.acquire_ttl(&name, 1).await;
        if r.status == 503 {
            let problem = r.expect_problem(503, "backend-unavailable");
            let detail = problem["detail"].as_str().unwrap_or("");
            assert!(
                detail.contains("ran out before the lock store's answer arrived")
                    && detail.contains("nothing is held"),
                "{problem}"
            );
            assert_eq!(app.holder(&name).await, None, "{name} is held after a 503");
        } else {
            r.expect_status(201);
        }
    }
}

/// The Redis keys of a lock are exactly the documented ones, with the
/// documented values and TTLs: the lock key, its fence counter (kept the
/// fence retention after the last grant), its holder hash (kept the fence
/// retention past the lease's end while the history is on: the lease's
/// record until its entry is written) and the history list, which gets an
/// exclusive lease's entry at its end (kept the retention after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keys_follow_the_documented_data_model() {
    let app = TestApp::redis().await;
    let redis = app.redis_server();
    let name = "orders:1";
    let (lock, fence, meta, history) = (
        lock_key(name),
        format!("{}:fence", lock_key(name)),
        format!("{}:meta", lock_key(name)),
        format!("{}:history", lock_key(name)),
    );
    let sorted = |mut keys: Vec<String>| {
        keys.sort();
        keys
    };
    let sent = Instant::now();
    let grant = app
        .acquire(name, Some(json!({ "ttl_ms": 5000, "owner": "w-1" })))
        .await;
    grant.expect_status(201);
    let token = grant.token();
    // No history list yet: the lease's record is its holder hash.
    assert_eq!(
        redis.keys().await,
        sorted(vec![lock.clone(), fence.clone(), meta.clone()])
    );
    let (value, _) = redis.get_with_pttl(&lock).await.expect("lock key");
    assert_eq!(value, token);
    let retention = i64::try_from(app.settings.store.fence_retention.as_millis()).unwrap();
    let (pttl, meta_pttl) = pttls_at_once(redis, &lock, &meta).await;
    assert_pttl_since(pttl, 5000, sent);
    assert!(
        (meta_pttl - pttl - retention).abs() <= 2,
        "meta PTTL {meta_pttl}, lock {pttl}"
    );
    let counter_pttl = redis.pttl(&fence).await;
    assert!(
        counter_pttl > retention - 1000 && counter_pttl <= retention,
        "fence counter PTTL {counter_pttl}"
    );
    let counter: u64 = redis.cmd(::redis::cmd("GET").arg(&fence)).await;
    assert_eq!(counter, grant.fence());
    assert_eq!(hash_ttl_ms(redis, &meta).await, Some(5000));
    let hash: std::collections::HashMap<String, String> =
        redis.cmd(::redis::cmd("HGETALL").arg(&meta)).await;
    assert_eq!(hash.get("fence"), Some(&grant.fence().to_string()));
    assert_eq!(hash.get("owner").map(String::as_str), Some("w-1"));
    assert_eq!(hash.get("meta").map(String::as_str), Some(""));
    let granted_ms: u64 = hash["granted_at_ms"].parse().expect("ms since epoch");
    let ends_ms: u64 = hash["ends_ms"].parse().expect("ms since epoch");
    assert_eq!(ends_ms - granted_ms, 5000, "{hash:?}");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    assert!(
        now_ms.abs_diff(granted_ms) < 5000,
        "granted_at_ms {granted_ms}"
    );

    // An extend moves both TTLs, and the lease's end.
    let sent = Instant::now();
    app.extend_ttl(name, &token, 9000).await.expect_status(200);
    let (lock_pttl, meta_pttl) = pttls_at_once(redis, &lock, &meta).await;
    assert_pttl_since(lock_pttl, 9000, sent);
    assert!(
        (meta_pttl - lock_pttl - retention).abs() <= 2,
        "meta PTTL {meta_pttl}"
    );
    assert_eq!(
        hash_ttl_ms(redis, &meta).await,
        Some(9000),
        "the lock's own TTL"
    );
    let extended_ends: u64 = redis
        .cmd(::redis::cmd("HGET").arg(&meta).arg("ends_ms"))
        .await;
    assert!(extended_ends >= ends_ms + 4000, "ends_ms {extended_ends}");

    // A release writes the lease's entry, `FENCE MODE GRANTED_MS
    // EXPIRES_MS HOW AT_MS`, the owner and the (empty) meta, and leaves
    // the fence counter and the history only, which run out on their own:
    // the history the retention after the release.
    app.release(name, &token).await.expect_status(204);
    assert_eq!(
        redis.keys().await,
        sorted(vec![fence.clone(), history.clone()])
    );
    assert!(redis.pttl(&fence).await > 0);
    let entries: Vec<String> = redis
        .cmd(::redis::cmd("LRANGE").arg(&history).arg(0).arg(-1))
        .await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    let fields: Vec<&str> = entries[0].split('\n').collect();
    assert_eq!(&fields[1..], ["w-1", ""], "{entries:?}");
    let header: Vec<&str> = fields[0].split(' ').collect();
    assert_eq!(
        header[..2],
        [grant.fence().to_string().as_str(), "exclusive"]
    );
    assert_eq!(header[2], granted_ms.to_string(), "{entries:?}");
    assert_eq!(header[3], extended_ends.to_string(), "{entries:?}");
    assert_eq!(header[4], "released", "{entries:?}");
    let history_pttl = redis.pttl(&history).await;
    assert!(
        history_pttl > retention - 1000 && history_pttl <= retention,
        "history PTTL {history_pttl} after the release"
    );

    // An expiry leaves the holder hash, the fence retention past the
    // lease's end: the next grant writes its entry, as expired then.
    // 200 ms: long enough for its answer to come on a busy machine.
    let short = app.acquire_ttl(name, 200).await;
    short.expect_status(201);
    assert!(short.fence() > grant.fence());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        redis.keys().await,
        sorted(vec![fence.clone(), meta.clone(), history.clone()])
    );
    let meta_pttl = redis.pttl(&meta).await;
    assert!(
        meta_pttl > retention - 1000 && meta_pttl <= retention,
        "meta PTTL {meta_pttl} after the expiry"
    );
    let counter: u64 = redis.cmd(::redis::cmd("GET").arg(&fence)).await;
    assert_eq!(counter, short.fence());
    let short_ends: String = redis
        .cmd(::redis::cmd("HGET").arg(&meta).arg("ends_ms"))
        .await;
    let next = app.acquire_ttl(name, 5000).await;
    next.expect_status(201);
    let entries: Vec<String> = redis
        .cmd(::redis::cmd("LRANGE").arg(&history).arg(0).arg(-1))
        .await;
    assert_eq!(entries.len(), 2, "{entries:?}");
    let header: Vec<&str> = entries[0].split('\n').next().unwrap().split(' ').collect();
    assert_eq!(header[0], short.fence().to_string(), "{entries:?}");
    assert_eq!(
        &header[3..],
        [short_ends.as_str(), "expired", short_ends.as_str()]
    );
}

/// The `ttl_ms` field of a lock's metadata hash.
async fn hash_ttl_ms(redis: &crate::support::RedisServer, meta: &str) -> Option<u64> {
    redis
        .cmd(::redis::cmd("HGET").arg(meta).arg("ttl_ms"))
        .await
}

async fn a_token_given_twice_is_refused_and_changes_nothing(app: &TestApp) {
    let name = "twice:k";
    let sent = Instant::now();
    let grant = app.acquire_ttl(name, 5000).await;
    grant.expect_status(201);
    let token = grant.token();
    let path = format!("/locks/{name}");
    let other = random_token();
    for method in [Method::PATCH, Method::DELETE] {
        // The Lock-Token header twice, even with the right token first.
        let twice = [
            ("Lock-Token", token.as_str()),
            ("Lock-Token", other.as_str()),
        ];
        let r = app
            .try_send(method.clone(), &path, &twice, None)
            .await
            .expect("answer");
        r.expect_problem(400, "invalid-request");
        // The header and the body both.
        let both = app
            .send_json(
                method.clone(),
                &path,
                &[("Lock-Token", token.as_str())],
                Some(json!({ "token": token })),
            )
            .await;
        both.expect_problem(400, "invalid-request");
    }
    let (holder, pttl) = app.holder(name).await.expect("still held");
    assert_eq!(holder, token);
    assert_pttl_since(pttl, 5000, sent);
}

/// The PTTLs of two keys read in one MULTI, so no time passes between them.
async fn pttls_at_once(redis: &crate::support::RedisServer, a: &str, b: &str) -> (i64, i64) {
    let mut conn = redis.connection().await;
    ::redis::pipe()
        .atomic()
        .cmd("PTTL")
        .arg(a)
        .cmd("PTTL")
        .arg(b)
        .query_async(&mut conn)
        .await
        .expect("PTTL of both keys")
}

async fn bodies_must_be_json_objects_and_uncompressed(app: &TestApp) {
    let before = app.lock_key_count().await;
    let path = "/locks/shape:k";
    for body in [
        r#"[1000,"abcdefghijklmnopqr","me"]"#,
        "[]",
        "5",
        r#""text""#,
        "null",
    ] {
        let r = app
            .send(Method::POST, path, &[], Some(body.as_bytes().to_vec()))
            .await;
        let problem = r.expect_problem(400, "invalid-request");
        assert!(
            problem["detail"].as_str().unwrap_or("").contains("object"),
            "{body}: {problem}"
        );
    }
    let gzip = [("Content-Encoding", "gzip")];
    let r = app
        .send(
            Method::POST,
            path,
            &gzip,
            Some(br#"{"ttl_ms":1000}"#.to_vec()),
        )
        .await;
    r.expect_problem(415, "unsupported-media-type");
    assert_eq!(
        app.lock_key_count().await,
        before,
        "a refused body wrote a lock"
    );
}

/// The OpenAPI document shows an optional body as an optional object, and
/// Schemathesis sends the JSON `null` as a body of the wrong type: on every
/// method it must be a 400 that writes nothing, while leaving the body out
/// (or sending an empty one) means the defaults.
async fn a_json_null_body_is_refused_and_an_absent_one_is_not(app: &TestApp) {
    let json = ("Content-Type", "application/json");
    let sent = Instant::now();
    let taken = app.send(Method::POST, "/locks/null:k", &[json], None).await;
    taken.expect_status(201);
    assert_lease_ms(
        Some(taken.u64("ttl_ms")),
        app.settings.limits.default_ttl.as_millis(),
        sent,
    );
    let token = taken.token();
    let holder = [json, ("Lock-Token", token.as_str())];
    let (_, pttl_before) = app.holder("null:k").await.expect("held");
    for body in ["null", " null\n"] {
        let body = || Some(body.as_bytes().to_vec());
        for (method, path, headers) in [
            (Method::POST, "/locks/null:free", &[json][..]),
            (Method::POST, "/locks/null:k", &holder[..]),
            (Method::PATCH, "/locks/null:k", &holder[..]),
            (Method::DELETE, "/locks/null:k", &holder[..]),
        ] {
            let problem = app
                .send(method.clone(), path, headers, body())
                .await
                .expect_problem(400, "invalid-request");
            assert!(
                problem["detail"].as_str().unwrap_or("").contains("object"),
                "{method} {path}: {problem}"
            );
        }
    }
    assert_eq!(app.holder("null:free").await, None);
    let (still, pttl_after) = app.holder("null:k").await.expect("still held");
    assert_eq!(still, token);
    assert!(pttl_after <= pttl_before, "{pttl_before} -> {pttl_after}");
    // With the token in its header, PATCH and DELETE need no body, and an
    // empty one is no body.
    app.send(Method::PATCH, "/locks/null:k", &holder, Some(Vec::new()))
        .await
        .expect_status(200);
    app.send(Method::DELETE, "/locks/null:k", &holder, None)
        .await
        .expect_status(204);
    assert_eq!(app.holder("null:k").await, None);
}

/// `{"ttl_ms":1000}` on `DELETE` (or `wait_ms` on `PATCH`) is refused as
/// a field the route does not take, not with the rule of its values, which
/// 1000 meets.
async fn a_field_the_route_does_not_take_is_named_unknown_whatever_its_value(app: &TestApp) {
    let taken = app.acquire_ttl("unknown:k", 30_000).await;
    taken.expect_status(201);
    let token = taken.token();
    let holder = [("Lock-Token", token.as_str())];
    for (method, body, field) in [
        (Method::DELETE, r#"{"ttl_ms":1000}"#, "ttl_ms"),
        (Method::DELETE, r#"{"wait_ms":1000}"#, "wait_ms"),
        (Method::PATCH, r#"{"wait_ms":1000}"#, "wait_ms"),
    ] {
        let problem = app
            .send(
                method.clone(),
                "/locks/unknown:k",
                &holder,
                Some(body.as_bytes().to_vec()),
            )
            .await
            .expect_problem(400, "invalid-request");
        let detail = problem["detail"].as_str().unwrap_or("");
        assert!(
            detail.contains(&format!("unknown field `{field}`")),
            "{method} {body}: {problem}"
        );
    }
    assert_eq!(app.holder("unknown:k").await.map(|(t, _)| t), Some(token));
}

/// A body field's name is echoed in the 400's `detail` only as a query
/// parameter's is: at most 64 characters, with no whitespace, `:`, `,` or
/// quote (docs/api.md), so that a secret put in a name cannot stand
/// outside the quotes the access log masks, nor a 5,000-character name
/// make a 10 kB answer (found by a new-user trial). Nothing is written.
async fn a_field_name_that_may_not_be_echoed_is_not(app: &TestApp) {
    let json = ("Content-Type", "application/json");
    let long = "n".repeat(65);
    for body in [
        r#"{"a SECRET1":1}"#.to_owned(),
        r#"{"a`SECRET1":1}"#.to_owned(),
        r#"{"a\"SECRET1":1}"#.to_owned(),
        r#"{"x: SECRET1, y":1}"#.to_owned(),
        r#"{"ttl_ms":1000,"a\nSECRET1":1}"#.to_owned(),
        r#"{"a SECRET1":1,"a SECRET1":2}"#.to_owned(),
        format!(r#"{{"{long}":1}}"#),
    ] {
        let problem = app
            .send(
                Method::POST,
                "/locks/echo:k",
                &[json],
                Some(body.as_bytes().to_vec()),
            )
            .await
            .expect_problem(400, "invalid-request");
        let detail = problem["detail"].as_str().unwrap_or("");
        assert!(
            !detail.contains("SECRET1") && !detail.contains(&long),
            "{body}: {problem}"
        );
        assert!(detail.contains("not echoed"), "{body}: {problem}");
    }
    // A plain name is named, as before.
    let problem = app
        .send(
            Method::POST,
            "/locks/echo:k",
            &[json],
            Some(br#"{"ttl":1}"#.to_vec()),
        )
        .await
        .expect_problem(400, "invalid-request");
    let detail = problem["detail"].as_str().unwrap_or("");
    assert!(detail.contains("unknown field `ttl`"), "{problem}");
    assert_eq!(app.holder("echo:k").await, None, "a 400 wrote a lock");
}

async fn a_lock_token_header_on_acquire_chooses_the_token(app: &TestApp) {
    let token = random_token();
    let header = [("Lock-Token", token.as_str())];
    let first = app.send(Method::POST, "/locks/hdr:k", &header, None).await;
    first.expect_status(201);
    assert_eq!(first.token(), token);
    // A retry with the same header renews instead of conflicting.
    let again = app.send(Method::POST, "/locks/hdr:k", &header, None).await;
    again.expect_status(200);
    assert_eq!(again.fence(), first.fence());
    assert_eq!(app.holder_token("hdr:k").await, Some(token.clone()));
    // Header and body both: refused.
    let both = app
        .send_json(
            Method::POST,
            "/locks/hdr:other",
            &header,
            Some(json!({ "token": token })),
        )
        .await;
    both.expect_problem(400, "invalid-request");
    assert_eq!(app.holder("hdr:other").await, None);
}

async fn a_token_in_any_url_is_refused(app: &TestApp) {
    let token = random_token();
    for path in [
        format!("/healthz?token={token}"),
        format!("/metrics?token={token}"),
        format!("/locks/url:k?tok%65n={token}"),
        format!("/locks/url:k?ttl_ms=1000&token={token}"),
    ] {
        let r = app.send(Method::GET, &path, &[], None).await;
        let problem = r.expect_problem(400, "invalid-request");
        assert!(
            problem["detail"].as_str().unwrap_or("").contains("URL"),
            "{path}: {problem}"
        );
        assert!(!r.text.contains(&token), "{path} echoed the token");
        // A read takes no token: the hint must not send it to a header.
        assert!(
            problem["detail"]
                .as_str()
                .unwrap_or("")
                .contains("takes no token"),
            "{path}: {problem}"
        );
    }
    let path = format!("/runs/url:k?token={token}");
    let r = app.send(Method::POST, &path, &[], None).await;
    let problem = r.expect_problem(400, "invalid-request");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or("")
            .contains("Lock-Token header"),
        "{path}: {problem}"
    );
}

async fn a_declared_oversized_body_is_refused_before_it_is_sent(app: &TestApp) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = app.url("").trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = "POST /locks/big:k HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n{";
    stream.write_all(head.as_bytes()).await.expect("send head");
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut answer))
        .await
        .expect("413 within 2 s, without waiting for the body")
        .expect("read");
    let text = String::from_utf8_lossy(&answer[..read]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("application/problem+json"), "{text}");
    assert_eq!(app.holder("big:k").await, None);
}

async fn unknown_methods_share_one_metric_label(app: &TestApp) {
    for method in ["BREW", "COFFEE42"] {
        let m = Method::from_bytes(method.as_bytes()).expect("method");
        app.send(m, "/healthz", &[], None).await.expect_status(405);
    }
    let text = app.metrics().await;
    assert!(!text.contains("BREW") && !text.contains("COFFEE42"));
    let other = metric(
        &text,
        "lockd_http_requests_total",
        &[
            ("method", "other"),
            ("route", "/healthz"),
            ("status", "405"),
        ],
    );
    assert_eq!(other, Some(2.0));
}

async fn reacquire_with_a_new_owner_label_updates_it(app: &TestApp) {
    let token = random_token();
    let first = app
        .acquire("own:k", Some(json!({ "token": token, "owner": "old" })))
        .await;
    first.expect_status(201);
    let again = app
        .acquire("own:k", Some(json!({ "token": token, "owner": "new" })))
        .await;
    again.expect_status(200);
    assert_eq!(app.inspect("own:k").await.str("owner"), "new");
    // Without an owner, the label stays.
    app.acquire("own:k", Some(json!({ "token": token })))
        .await
        .expect_status(200);
    assert_eq!(app.inspect("own:k").await.str("owner"), "new");
}

/// A lock key a foreign client set with no TTL (`SET` without `PX`) frees
/// only when that client deletes it: the 409 says so, suggests a retry
/// (`Retry-After`), and claims no lease end, exclusive or shared.
#[tokio::test]
async fn a_key_set_with_no_ttl_is_409_without_a_lease_end() {
    let app = TestApp::redis().await;
    let name = "no-ttl:k";
    app.set_lock_key_without_ttl(name).await;
    assert_eq!(app.redis_server().pttl(&lock_key(name)).await, -1);
    let shared = json!({ "ttl_ms": 5000, "mode": "shared" });
    for (r, mode) in [
        (app.acquire_ttl(name, 5000).await, "exclusive"),
        (app.acquire(name, Some(shared)).await, "shared"),
    ] {
        let problem = r.expect_problem(409, "lock-held");
        let detail = problem["detail"].as_str().expect("detail");
        assert!(detail.contains("no TTL"), "{mode}: {detail}");
        assert!(
            !detail.contains("at most") && !detail.contains("try again in"),
            "{mode}: a lease end is claimed: {detail}"
        );
        assert_eq!(r.header("retry-after").as_deref(), Some("1"), "{mode}");
        assert_eq!(problem["retry_after_ms"], 1000, "{mode}: {problem}");
    }
    assert_eq!(
        app.redis_server().lock_token(name).await.as_deref(),
        Some("foreign"),
        "untouched"
    );
    // Once that client deletes it, the lock is granted.
    app.redis_server()
        .cmd::<()>(::redis::cmd("DEL").arg(lock_key(name)))
        .await;
    app.acquire_ttl(name, 5000).await.expect_status(201);
}

#[tokio::test]
async fn a_key_of_the_wrong_type_is_a_500_and_leaves_no_half_written_lock() {
    let app = TestApp::redis().await;
    let redis = app.redis_server();
    let fence = format!("{}:fence", lock_key("wrong:k"));
    redis
        .cmd::<()>(::redis::cmd("SET").arg(&fence).arg("notanumber"))
        .await;
    let r = app.acquire_ttl("wrong:k", 5000).await;
    let problem = r.expect_problem(500, "backend-error");
    assert!(
        !r.text.contains("notanumber") && !r.text.contains("ERR"),
        "{problem}"
    );
    assert_eq!(
        app.holder("wrong:k").await,
        None,
        "the lock was left without a fence"
    );
    // Stale metadata of the wrong type is replaced by the grant's own.
    let meta = format!("{}:meta", lock_key("wrong:m"));
    redis
        .cmd::<()>(::redis::cmd("SET").arg(&meta).arg("x"))
        .await;
    let grant = app.acquire_ttl("wrong:m", 5000).await;
    grant.expect_status(201);
    assert_eq!(app.inspect("wrong:m").await.fence(), grant.fence());
}
