//! Holder metadata (`meta`) through HTTP: a JSON object given at acquire
//! (a lock's exclusive or shared lease, a semaphore permit, a run's
//! attempt) is shown by `GET`, listings and watches, replaced by a renewal
//! that gives one and kept by one that does not; a value that is not an
//! object, or is over `--max-meta-bytes`, is a 400 problem that writes
//! nothing. On a real Redis, the memory backend and Redlock (locks), and
//! Redis and memory for what Redlock refuses (shared leases, semaphores,
//! runs, watches).

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{EventStream, TestApp, backend_tests, redis_and_memory_tests};

backend_tests!(
    a_locks_meta_is_shown_by_get_and_listing_and_a_renewal_replaces_it,
    meta_that_is_not_a_small_object_is_refused_and_writes_nothing,
);

backend_tests!(
    mod capped = |s| s.limits.max_meta_bytes = crate::meta::SMALL_CAP;
    meta_over_max_meta_bytes_is_refused,
);

/// The kinds of lease Redlock refuses (501), and watches.
mod kinds {
    use super::*;

    redis_and_memory_tests!(
        shared_leases_permits_and_run_attempts_show_their_meta,
        watch_events_carry_the_holders_meta,
    );

    async fn shared_leases_permits_and_run_attempts_show_their_meta(app: &TestApp) {
        // Two shared leases, each with its own meta.
        for (i, host) in ["r-1", "r-2"].iter().enumerate() {
            app.acquire(
                "meta:shared",
                Some(json!({"mode": "shared", "ttl_ms": 30_000 + i as u64 * 1000, "meta": {"host": host}})),
            )
            .await
            .expect_status(201);
        }
        let status = app.inspect("meta:shared").await.json();
        let hosts: Vec<&Value> = status["holders"]
            .as_array()
            .expect("holders")
            .iter()
            .map(|h| &h["meta"]["host"])
            .collect();
        assert_eq!(hosts, [&json!("r-1"), &json!("r-2")], "{status}");
        assert_eq!(
            status["meta"],
            json!({"host": "r-2"}),
            "the lease that ends last"
        );

        // A permit.
        app.send_json(
            Method::POST,
            "/semaphores/meta:sem",
            &[],
            Some(json!({"limit": 2, "meta": {"slot": "gpu-0"}})),
        )
        .await
        .expect_status(201);
        let sem = app.get("/semaphores/meta:sem").await.json();
        assert_eq!(sem["permits"][0]["meta"], json!({"slot": "gpu-0"}), "{sem}");

        // A run's attempt: shown while running.
        let started = app
            .send_json(
                Method::POST,
                "/runs/meta:delivery-1",
                &[],
                Some(json!({"meta": {"worker": "w-3"}})),
            )
            .await;
        started.expect_status(201);
        let run = app.get("/runs/meta:delivery-1").await.json();
        assert_eq!(run["state"], "running", "{run}");
        assert_eq!(run["meta"], json!({"worker": "w-3"}), "{run}");
    }

    async fn watch_events_carry_the_holders_meta(app: &TestApp) {
        let mut events = EventStream::open(app, "/locks/meta:watched/events", &[]).await;
        events.expect("state").await;
        let meta = json!({"leader": "10.0.0.9:8080"});
        app.acquire("meta:watched", Some(json!({"meta": meta})))
            .await
            .expect_status(201);
        let acquired = events.expect("acquired").await;
        assert_eq!(acquired.data["meta"], meta, "{acquired:?}");

        // A watch opened now starts with a state that carries it.
        let mut late = EventStream::open(app, "/locks/meta:watched/events", &[]).await;
        let state = late.expect("state").await;
        assert_eq!(state.data["meta"], meta, "{state:?}");
    }
}

/// A 64-byte cap, for the oversize check.
const SMALL_CAP: usize = 64;

async fn a_locks_meta_is_shown_by_get_and_listing_and_a_renewal_replaces_it(app: &TestApp) {
    let meta = json!({"leader": "10.0.0.7:8080", "pid": 4242, "tags": ["a", "b"]});
    let grant = app
        .acquire("meta:leader", Some(json!({"ttl_ms": 30_000, "meta": meta})))
        .await;
    grant.expect_status(201);
    let token = grant.token();
    assert_eq!(app.inspect("meta:leader").await.json()["meta"], meta);

    let listed = app.get("/locks?prefix=meta:").await;
    listed.expect_status(200);
    let item = &listed.json()["locks"][0];
    assert_eq!(item["name"], "meta:leader", "{}", listed.text);
    assert_eq!(item["meta"], meta, "{}", listed.text);

    // A lock taken without meta shows `null`.
    app.acquire("meta:plain", None).await.expect_status(201);
    assert_eq!(app.inspect("meta:plain").await.json()["meta"], Value::Null);

    // Renewing (the same token) with new meta replaces it; without, keeps it.
    let newer = json!({"leader": "10.0.0.8:8080"});
    let renewed = app
        .send_json(
            Method::POST,
            "/locks/meta:leader",
            &[("lock-token", &token)],
            Some(json!({"meta": newer})),
        )
        .await;
    renewed.expect_status(200);
    assert_eq!(app.inspect("meta:leader").await.json()["meta"], newer);
    app.send_json(
        Method::POST,
        "/locks/meta:leader",
        &[("lock-token", &token)],
        Some(json!({})),
    )
    .await
    .expect_status(200);
    assert_eq!(app.inspect("meta:leader").await.json()["meta"], newer);

    // The next holder's lease starts without the last one's meta.
    app.release("meta:leader", &token).await.expect_status(204);
    app.acquire("meta:leader", None).await.expect_status(201);
    assert_eq!(app.inspect("meta:leader").await.json()["meta"], Value::Null);
}

async fn meta_that_is_not_a_small_object_is_refused_and_writes_nothing(app: &TestApp) {
    let big = json!({"blob": "x".repeat(2000)});
    for (what, meta) in [
        ("an array", json!([1, 2])),
        ("a string", json!("web-1")),
        ("a number", json!(7)),
        ("true", json!(true)),
        ("over the default 1024 bytes", big),
    ] {
        let refused = app.acquire("meta:bad", Some(json!({"meta": meta}))).await;
        refused.expect_status(400);
        let problem = refused.json();
        assert!(
            problem["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("meta"),
            "{what}: {}",
            refused.text
        );
        assert_eq!(
            app.inspect("meta:bad").await.status.as_u16(),
            404,
            "{what} wrote a lock"
        );
    }
    assert_eq!(
        app.lock_key_count().await,
        0,
        "a refused acquire left a key"
    );
}

/// The cap is `--max-meta-bytes`, counted as compact JSON: at the cap is
/// taken, one byte over is refused (and the answer says the cap).
async fn meta_over_max_meta_bytes_is_refused(app: &TestApp) {
    // {"n":"…"} is 8 bytes around the text.
    let at_cap = json!({"n": "y".repeat(SMALL_CAP - 8)});
    assert_eq!(at_cap.to_string().len(), SMALL_CAP);
    app.acquire("meta:fits", Some(json!({"meta": at_cap})))
        .await
        .expect_status(201);
    let over = json!({"n": "y".repeat(SMALL_CAP - 7)});
    let refused = app.acquire("meta:over", Some(json!({"meta": over}))).await;
    refused.expect_status(400);
    assert!(
        refused.text.contains(&SMALL_CAP.to_string()),
        "{}",
        refused.text
    );
    assert_eq!(app.inspect("meta:over").await.status.as_u16(), 404);
}
