//! API keys, driven over HTTP as clients would: tenants kept apart by lock
//! name prefix (even holding another tenant's lock token), permissions per
//! method, 401 for missing, unknown and malformed `Authorization`, 403 for
//! the rest, `/metrics` behind the `metrics` permission, and the open
//! routes. Each refusal is a problem document and writes nothing.

use std::path::PathBuf;

use crate::support::{Reply, TestApp, random_token};
use lockd::auth::{Permission, secret_sha256};
use lockd::config::Settings;
use reqwest::Method;

/// A key for the keys file: id, secret, prefixes, permissions.
struct TestKey {
    id: &'static str,
    secret: String,
    prefixes: &'static [&'static str],
    permissions: &'static [Permission],
    /// `requests_per_second`, if any.
    rate: Option<u32>,
}

impl TestKey {
    fn new(
        id: &'static str,
        prefixes: &'static [&'static str],
        permissions: &'static [Permission],
    ) -> Self {
        Self {
            id,
            secret: format!("secret-{id}-{}", random_token()),
            prefixes,
            permissions,
            rate: None,
        }
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", self.secret)
    }
}

const ALL_LOCK: &[Permission] = &[
    Permission::Acquire,
    Permission::Extend,
    Permission::Release,
    Permission::Read,
];

/// Writes a keys file of `keys` in a fresh temp dir (kept for the test).
fn keys_file(keys: &[&TestKey]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.toml");
    let text: String = keys
        .iter()
        .map(|k| crate::support::key_entry(k.id, &k.secret, k.prefixes, k.permissions, k.rate))
        .collect();
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

async fn app_with_keys(
    keys: &[&TestKey],
    tweak: impl FnOnce(&mut Settings),
) -> (TestApp, tempfile::TempDir) {
    let (dir, path) = keys_file(keys);
    let app = TestApp::redis_with(|s| {
        s.auth.keys_file = Some(path);
        tweak(s);
    })
    .await;
    (app, dir)
}

async fn call(
    app: &TestApp,
    method: Method,
    name: &str,
    auth: Option<&str>,
    lock_token: Option<&str>,
) -> Reply {
    let mut headers = Vec::new();
    if let Some(auth) = auth {
        headers.push(("Authorization", auth));
    }
    if let Some(token) = lock_token {
        headers.push(("Lock-Token", token));
    }
    app.send(method, &format!("/locks/{name}"), &headers, None)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_a_cannot_touch_tenant_b_locks_even_with_b_lock_token() {
    let a = TestKey::new("tenant-a", &["a:"], ALL_LOCK);
    let b = TestKey::new("tenant-b", &["b:"], ALL_LOCK);
    let (app, _dir) = app_with_keys(&[&a, &b], |_| {}).await;
    let granted = call(&app, Method::POST, "b:job", Some(&b.bearer()), None).await;
    granted.expect_status(201);
    let (b_token, fence) = (granted.token(), granted.fence());

    for method in [Method::POST, Method::PATCH, Method::DELETE, Method::GET] {
        let reply = call(
            &app,
            method.clone(),
            "b:job",
            Some(&a.bearer()),
            Some(&b_token),
        )
        .await;
        let problem = reply.expect_problem(403, "forbidden");
        assert!(problem["detail"].as_str().unwrap().contains("prefixes"));
        assert_eq!(
            app.holder_token("b:job").await.as_deref(),
            Some(&*b_token),
            "{method}"
        );
    }
    // B still holds it, with the same fence, and can release it.
    let status = call(&app, Method::GET, "b:job", Some(&b.bearer()), None).await;
    status.expect_status(200);
    assert_eq!(status.fence(), fence);
    call(
        &app,
        Method::DELETE,
        "b:job",
        Some(&b.bearer()),
        Some(&b_token),
    )
    .await
    .expect_status(204);
    // A's own prefix works; "a" alone (no colon) is not under "a:".
    call(&app, Method::POST, "a:job", Some(&a.bearer()), None)
        .await
        .expect_status(201);
    call(&app, Method::POST, "a", Some(&a.bearer()), None)
        .await
        .expect_problem(403, "forbidden");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_wrong_and_malformed_authorization_get_401_and_write_nothing() {
    let key = TestKey::new("worker", &["*"], ALL_LOCK);
    let (app, _dir) = app_with_keys(&[&key], |_| {}).await;

    let missing = call(&app, Method::POST, "job", None, None).await;
    missing.expect_problem(401, "unauthorized");
    assert_eq!(
        missing.header("www-authenticate").as_deref(),
        Some(r#"Bearer realm="lockd""#)
    );

    let wrong = call(&app, Method::POST, "job", Some("Bearer not-a-key"), None).await;
    wrong.expect_problem(401, "unauthorized");
    assert_eq!(
        wrong.header("www-authenticate").as_deref(),
        Some(r#"Bearer realm="lockd", error="invalid_token""#)
    );
    // The hash itself is not a secret that works.
    let hashed = format!("Bearer {}", secret_sha256(&key.secret));
    call(&app, Method::POST, "job", Some(&hashed), None)
        .await
        .expect_problem(401, "unauthorized");

    let malformed = [
        format!("Basic {}", key.secret),
        "Bearer".to_owned(),
        "Bearer ".to_owned(),
        format!("Bearer {} extra", key.secret),
        format!("Token {}", key.secret),
        key.secret.clone(),
    ];
    for header in &malformed {
        let reply = call(&app, Method::POST, "job", Some(header), None).await;
        reply.expect_problem(401, "unauthorized");
        assert_eq!(
            reply.header("www-authenticate").as_deref(),
            Some(r#"Bearer realm="lockd", error="invalid_request""#),
            "{header:?}"
        );
        assert!(
            !reply.text.contains(&key.secret),
            "the answer echoes the secret"
        );
    }
    // Two Authorization headers, even both right, are refused.
    let twice = app
        .send(
            Method::POST,
            "/locks/job",
            &[
                ("Authorization", &key.bearer()),
                ("Authorization", &key.bearer()),
            ],
            None,
        )
        .await;
    twice.expect_problem(401, "unauthorized");
    assert_eq!(
        app.lock_key_count().await,
        0,
        "a refused request wrote a lock"
    );

    // The scheme is case-insensitive (RFC 9110 §11.1).
    let lower = format!("bearer {}", key.secret);
    call(&app, Method::POST, "job", Some(&lower), None)
        .await
        .expect_status(201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_method_needs_its_permission() {
    let reader = TestKey::new("reader", &["*"], &[Permission::Read]);
    let taker = TestKey::new("taker", &["*"], &[Permission::Acquire]);
    let (app, _dir) = app_with_keys(&[&reader, &taker], |_| {}).await;

    call(&app, Method::POST, "job", Some(&reader.bearer()), None)
        .await
        .expect_problem(403, "forbidden");
    assert_eq!(app.lock_key_count().await, 0);
    let granted = call(&app, Method::POST, "job", Some(&taker.bearer()), None).await;
    granted.expect_status(201);
    let token = granted.token();
    call(&app, Method::GET, "job", Some(&reader.bearer()), None)
        .await
        .expect_status(200);
    call(&app, Method::GET, "job", Some(&taker.bearer()), None)
        .await
        .expect_problem(403, "forbidden");
    for method in [Method::PATCH, Method::DELETE] {
        let reply = call(&app, method, "job", Some(&taker.bearer()), Some(&token)).await;
        let problem = reply.expect_problem(403, "forbidden");
        assert!(problem["detail"].as_str().unwrap().contains("permission"));
    }
    assert_eq!(app.holder_token("job").await.as_deref(), Some(&*token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_metrics_permission_and_health_stays_open() {
    let worker = TestKey::new("worker", &["*"], ALL_LOCK);
    let scraper = TestKey::new("prometheus", &["*"], &[Permission::Metrics]);
    let (app, _dir) = app_with_keys(&[&worker, &scraper], |_| {}).await;

    app.get("/metrics")
        .await
        .expect_problem(401, "unauthorized");
    app.send(
        Method::GET,
        "/metrics",
        &[("Authorization", &worker.bearer())],
        None,
    )
    .await
    .expect_problem(403, "forbidden");
    let scrape = app
        .send(
            Method::GET,
            "/metrics",
            &[("Authorization", &scraper.bearer())],
            None,
        )
        .await;
    scrape.expect_status(200);
    assert!(scrape.text.contains("lockd_http_requests_total"));
    // A metrics-only key takes no lock.
    call(&app, Method::POST, "job", Some(&scraper.bearer()), None)
        .await
        .expect_problem(403, "forbidden");
    for open in ["/healthz", "/readyz", "/openapi.json", "/docs"] {
        app.get(open).await.expect_status(200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_on_their_own_listener_need_no_key() {
    let worker = TestKey::new("worker", &["*"], ALL_LOCK);
    let (app, _dir) = app_with_keys(&[&worker], |s| {
        s.metrics.listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let addr = app.metrics_addr.expect("metrics listener");
    let scrape = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(scrape.status(), 200);
    // A token in the URL is refused there too.
    let leaked = reqwest::get(format!("http://{addr}/metrics?token=abc"))
        .await
        .unwrap();
    assert_eq!(leaked.status(), 400);
    // The main listener no longer serves /metrics at all.
    app.send(
        Method::GET,
        "/metrics",
        &[("Authorization", &worker.bearer())],
        None,
    )
    .await
    .expect_problem(404, "route-not-found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_keys_file_refuses_everyone() {
    let (app, _dir) = app_with_keys(&[], |_| {}).await;
    call(
        &app,
        Method::POST,
        "job",
        Some("Bearer anything-at-all"),
        None,
    )
    .await
    .expect_problem(401, "unauthorized");
    app.get("/healthz").await.expect_status(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_rate_gets_429_with_retry_after_and_others_do_not() {
    // 1 per second for "slow" only.
    let slow = TestKey {
        rate: Some(1),
        ..TestKey::new("slow", &["*"], ALL_LOCK)
    };
    let free = TestKey::new("free", &["*"], ALL_LOCK);
    let (app, _dir) = app_with_keys(&[&slow, &free], |_| {}).await;

    call(&app, Method::GET, "rate:k", Some(&slow.bearer()), None)
        .await
        .expect_status(404);
    let limited = call(&app, Method::GET, "rate:k", Some(&slow.bearer()), None).await;
    let problem = limited.expect_problem(429, "rate-limited");
    let wait_ms = problem["retry_after_ms"].as_u64().unwrap();
    assert!((1..=1000).contains(&wait_ms), "retry_after_ms {wait_ms}");
    assert_eq!(limited.header("retry-after").as_deref(), Some("1"));
    // A limited acquire writes nothing.
    call(&app, Method::POST, "rate:k", Some(&slow.bearer()), None)
        .await
        .expect_problem(429, "rate-limited");
    assert_eq!(app.lock_key_count().await, 0);
    // Another key is not limited by it.
    for _ in 0..5 {
        call(&app, Method::GET, "rate:k", Some(&free.bearer()), None)
            .await
            .expect_status(404);
    }
    // After the wait, the slow key gets in again.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    call(&app, Method::POST, "rate:k", Some(&slow.bearer()), None)
        .await
        .expect_status(201);
}

/// Semaphores use the keys' prefixes and permissions exactly as locks do:
/// a tenant takes permits under its own prefix only, a read-only key may
/// list but not take, and each refusal writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_use_the_same_prefixes_and_permissions_as_locks() {
    let a = TestKey::new("tenant-a", &["a:"], ALL_LOCK);
    let reader = TestKey::new("reader", &["a:"], &[Permission::Read]);
    let (app, _dir) = app_with_keys(&[&a, &reader], |_| {}).await;
    let send = |method: Method, name: &str, auth: &str, token: Option<&str>| {
        let mut headers = vec![("Authorization", auth.to_owned())];
        if let Some(token) = token {
            headers.push(("Lock-Token", token.to_owned()));
        }
        let path = format!("/semaphores/{name}");
        let app = &app;
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let body = (method == Method::POST).then(|| br#"{"limit": 2}"#.to_vec());
            app.send(method, &path, &headers, body).await
        }
    };
    let granted = send(Method::POST, "a:pool", &a.bearer(), None).await;
    granted.expect_status(201);
    let token = granted.token();
    send(Method::POST, "b:pool", &a.bearer(), None)
        .await
        .expect_problem(403, "forbidden");
    send(Method::POST, "a:pool", &reader.bearer(), None)
        .await
        .expect_problem(403, "forbidden");
    for method in [Method::PATCH, Method::DELETE] {
        send(method, "a:pool", &reader.bearer(), Some(&token))
            .await
            .expect_problem(403, "forbidden");
    }
    let listed = send(Method::GET, "a:pool", &reader.bearer(), None).await;
    listed.expect_status(200);
    assert_eq!(listed.u64("holders"), 1);
    send(Method::GET, "a:pool", "Bearer nope", None)
        .await
        .expect_problem(401, "unauthorized");
    send(Method::DELETE, "a:pool", &a.bearer(), Some(&token))
        .await
        .expect_status(204);
    assert_eq!(app.lock_key_count().await, 0, "the refusals wrote nothing");
}

/// A watch (`GET .../events`) needs the `read` permission and a name under
/// the key's prefixes, as `GET` does; without a key, 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_need_read_and_a_name_under_the_keys_prefixes() {
    let reader = TestKey::new("reader", &["a:"], &[Permission::Read]);
    let writer = TestKey::new("writer", &["a:"], &[Permission::Acquire]);
    let (app, _dir) = app_with_keys(&[&reader, &writer], |_| {}).await;
    for path in ["/locks/a:job/events", "/semaphores/a:pool/events"] {
        let auth = reader.bearer();
        let mut stream =
            crate::support::EventStream::open(&app, path, &[("Authorization", &auth)]).await;
        stream.expect("state").await;
    }
    let refused = |path: &'static str, auth: Option<String>| {
        let app = &app;
        async move {
            let mut headers = Vec::new();
            if let Some(auth) = &auth {
                headers.push(("Authorization", auth.as_str()));
            }
            app.send(Method::GET, path, &headers, None).await
        }
    };
    refused("/locks/b:job/events", Some(reader.bearer()))
        .await
        .expect_problem(403, "forbidden");
    refused("/semaphores/b:pool/events", Some(reader.bearer()))
        .await
        .expect_problem(403, "forbidden");
    refused("/locks/a:job/events", Some(writer.bearer()))
        .await
        .expect_problem(403, "forbidden");
    refused("/locks/a:job/events", None)
        .await
        .expect_problem(401, "unauthorized");
}
