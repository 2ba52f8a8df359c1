//! A name's history through HTTP (`GET /locks/{name}/history`, a
//! semaphore's, a run's): each lease newest first, with its owner, meta,
//! grant, lease end and how it ended, an expiry told though nobody was
//! watching, bounded by `--history-length` (0: none), never a token. On a
//! real Redis, the memory backend and Redlock (locks); Redis and memory
//! for what Redlock refuses.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{TestApp, backend_tests, redis_and_memory_tests};

backend_tests!(
    a_locks_history_tells_each_lease_newest_first_and_how_it_ended,
    a_history_reads_the_same_from_any_name_never_granted,
);

backend_tests!(
    mod short = |s| s.store.history_length = lockd::lock::history::HistoryLength::new(3).unwrap();
    a_history_keeps_history_length_leases,
);

backend_tests!(
    mod off = |s| s.store.history_length = lockd::lock::history::HistoryLength::OFF;
    history_length_zero_keeps_no_history,
);

mod kinds {
    use super::*;

    redis_and_memory_tests!(
        a_semaphores_history_tells_each_permit,
        a_runs_history_tells_each_attempt,
        shared_leases_each_have_an_entry,
        leases_of_both_modes_read_in_grant_order_once_each,
        a_renewal_shows_its_owner_in_get_and_the_grants_in_the_history,
        a_runs_renewal_shows_its_owner_in_get_and_the_starts_in_the_history,
        a_runs_attempt_that_ran_out_is_in_its_history_with_nobody_taking_over,
    );
}

/// `GET /locks/{name}/history`, 200.
async fn history(app: &TestApp, path: &str) -> Value {
    let reply = app.get(&format!("{path}/history")).await;
    reply.expect_status(200);
    reply.json()
}

/// Waits until `GET path` answers 404: the lease ran out.
async fn until_free(app: &TestApp, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while app.get(path).await.status != reqwest::StatusCode::NOT_FOUND {
        assert!(Instant::now() < deadline, "{path} still held after 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_locks_history_tells_each_lease_newest_first_and_how_it_ended(app: &TestApp) {
    let name = "hist:job";
    let meta = json!({"host": "web-1", "pid": 42});
    let first = app
        .acquire(
            name,
            Some(json!({"ttl_ms": 30_000, "owner": "a", "meta": meta})),
        )
        .await;
    first.expect_status(201);
    let token_a = first.token();
    app.extend_ttl(name, &token_a, 60_000)
        .await
        .expect_status(200);
    app.release(name, &token_a).await.expect_status(204);

    // A lease that runs out with nobody watching.
    let second = app
        .acquire(name, Some(json!({"ttl_ms": 300, "owner": "b"})))
        .await;
    second.expect_status(201);
    until_free(app, &format!("/locks/{name}")).await;

    let third = app
        .acquire(name, Some(json!({"ttl_ms": 30_000, "owner": "c"})))
        .await;
    third.expect_status(201);

    let reply = app.get(&format!("/locks/{name}/history")).await;
    reply.expect_status(200);
    for token in [&token_a, &second.token(), &third.token()] {
        assert!(
            !reply.text.contains(token.as_str()),
            "a token in {}",
            reply.text
        );
    }
    let body = reply.json();
    assert_eq!(body["name"], name);
    assert_eq!(body["history_length"], 20);
    let entries = body["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 3, "{body}");
    let fences: Vec<u64> = entries
        .iter()
        .map(|e| e["fence"].as_u64().unwrap())
        .collect();
    assert_eq!(
        fences,
        [third.fence(), second.fence(), first.fence()],
        "newest first"
    );

    let held = &entries[0];
    assert_eq!(held["owner"], "c");
    assert_eq!(held["ended"], Value::Null, "{held}");
    assert_eq!(held["ended_at"], Value::Null);
    assert_eq!(held["mode"], "exclusive");

    let expired = &entries[1];
    assert_eq!(expired["ended"], "expired", "{expired}");
    assert_eq!(
        expired["ended_at"], expired["expires_at"],
        "an expiry ends at the lease's end: {expired}"
    );
    assert_eq!(expired["held_ms"], 300, "{expired}");

    let released = &entries[2];
    assert_eq!(released["ended"], "released", "{released}");
    assert_eq!(released["owner"], "a");
    assert_eq!(released["meta"], meta);
    assert_eq!(released["broken_by"], Value::Null);
    // The extend moved the lease's end to a minute past its grant.
    let granted = humantime::parse_rfc3339(released["granted_at"].as_str().unwrap()).unwrap();
    let ends = humantime::parse_rfc3339(released["expires_at"].as_str().unwrap()).unwrap();
    let lasted = ends.duration_since(granted).unwrap();
    assert!(lasted >= Duration::from_secs(59), "{released}");
    assert!(released["held_ms"].as_u64().unwrap() < 30_000, "{released}");
}

async fn a_history_reads_the_same_from_any_name_never_granted(app: &TestApp) {
    let body = history(app, "/locks/hist:never").await;
    assert_eq!(body["entries"], json!([]), "{body}");
    app.get("/locks/no%20such/history")
        .await
        .expect_problem(400, "invalid-request");
}

async fn a_history_keeps_history_length_leases(app: &TestApp) {
    let name = "hist:short";
    let mut fences = Vec::new();
    for _ in 0..5 {
        let grant = app.acquire_ttl(name, 30_000).await;
        grant.expect_status(201);
        fences.push(grant.fence());
        app.release(name, &grant.token()).await.expect_status(204);
    }
    let body = history(app, &format!("/locks/{name}")).await;
    assert_eq!(body["history_length"], 3);
    let kept: Vec<u64> = body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["fence"].as_u64().unwrap())
        .collect();
    fences.reverse();
    assert_eq!(kept, fences[..3], "the newest three");
}

async fn history_length_zero_keeps_no_history(app: &TestApp) {
    let grant = app.acquire_ttl("hist:off", 30_000).await;
    grant.expect_status(201);
    app.release("hist:off", &grant.token())
        .await
        .expect_status(204);
    let body = history(app, "/locks/hist:off").await;
    assert_eq!(body["history_length"], 0);
    assert_eq!(body["entries"], json!([]));
    if app.is_redis() {
        assert!(
            !app.redis_server()
                .keys()
                .await
                .iter()
                .any(|k| k.contains("history")),
            "nothing written"
        );
    }
}

async fn a_semaphores_history_tells_each_permit(app: &TestApp) {
    let take = |owner: &'static str, ttl_ms: u64| async move {
        let reply = app
            .send_json(
                Method::POST,
                "/semaphores/hist:pool",
                &[],
                Some(json!({"limit": 3, "ttl_ms": ttl_ms, "owner": owner})),
            )
            .await;
        reply.expect_status(201);
        reply
    };
    let given_back = take("a", 30_000).await;
    let runs_out = take("b", 300).await;
    let held = take("c", 30_000).await;
    app.send(
        Method::DELETE,
        "/semaphores/hist:pool",
        &[("Lock-Token", &given_back.token())],
        None,
    )
    .await
    .expect_status(204);
    // The short permit runs out; the history says so as soon as it has.
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let body = history(app, "/semaphores/hist:pool").await;
        if body["entries"][1]["ended"] == "expired" {
            break body;
        }
        assert!(Instant::now() < deadline, "never expired: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let entries = body["entries"].as_array().unwrap();
    let summary: Vec<(u64, &str, Value)> = entries
        .iter()
        .map(|e| {
            (
                e["fence"].as_u64().unwrap(),
                e["owner"].as_str().unwrap(),
                e["ended"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (held.fence(), "c", Value::Null),
            (runs_out.fence(), "b", json!("expired")),
            (given_back.fence(), "a", json!("released")),
        ],
        "{body}"
    );
    assert!(entries.iter().all(|e| e.get("mode").is_none()), "{body}");
}

async fn a_runs_history_tells_each_attempt(app: &TestApp) {
    let key = "hist:delivery";
    let start = |ttl_ms: u64| async move {
        app.send_json(
            Method::POST,
            &format!("/runs/{key}"),
            &[],
            Some(json!({"ttl_ms": ttl_ms, "owner": "worker"})),
        )
        .await
    };
    let abandoned = start(30_000).await;
    abandoned.expect_status(201);
    app.send(
        Method::DELETE,
        &format!("/runs/{key}"),
        &[("Lock-Token", &abandoned.token())],
        None,
    )
    .await
    .expect_status(204);
    let lapsed = start(300).await;
    lapsed.expect_status(201);
    // Taken over once its lease ran out.
    let deadline = Instant::now() + Duration::from_secs(20);
    let done = loop {
        let reply = start(30_000).await;
        if reply.status == reqwest::StatusCode::CREATED {
            break reply;
        }
        assert!(
            Instant::now() < deadline,
            "never taken over: {}",
            reply.text
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    app.send_json(
        Method::PUT,
        &format!("/runs/{key}/result"),
        &[("Lock-Token", &done.token())],
        Some(json!({"result": {"ok": true}})),
    )
    .await
    .expect_status(200);
    let body = history(app, &format!("/runs/{key}")).await;
    assert_eq!(body["key"], key, "{body}");
    let ends: Vec<(u64, Value)> = body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["fence"].as_u64().unwrap(), e["ended"].clone()))
        .collect();
    assert_eq!(
        ends,
        [
            (done.fence(), json!("completed")),
            (lapsed.fence(), json!("expired")),
            (abandoned.fence(), json!("abandoned")),
        ],
        "{body}"
    );
}

async fn shared_leases_each_have_an_entry(app: &TestApp) {
    let name = "hist:shared";
    let mut readers = Vec::new();
    for owner in ["r-1", "r-2"] {
        let reply = app
            .acquire(
                name,
                Some(json!({"mode": "shared", "ttl_ms": 30_000, "owner": owner})),
            )
            .await;
        reply.expect_status(201);
        readers.push(reply);
    }
    // The older lease ends first: its entry is not the newest.
    app.release(name, &readers[0].token())
        .await
        .expect_status(204);
    let body = history(app, &format!("/locks/{name}")).await;
    let entries = body["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{body}");
    assert_eq!(entries[0]["fence"].as_u64(), Some(readers[1].fence()));
    assert_eq!(entries[0]["mode"], "shared");
    assert_eq!(entries[0]["ended"], Value::Null, "{body}");
    assert_eq!(entries[1]["fence"].as_u64(), Some(readers[0].fence()));
    assert_eq!(entries[1]["ended"], "released", "{body}");
}

/// An exclusive lease's entry is written at its end (for one that ran out,
/// by the next exclusive grant), a shared lease's at its grant: the
/// history still reads newest grant first, each lease once, however the
/// two modes take turns.
async fn leases_of_both_modes_read_in_grant_order_once_each(app: &TestApp) {
    let name = "hist:turns";
    let path = format!("/locks/{name}");
    let lapsed = app
        .acquire(name, Some(json!({"ttl_ms": 200, "owner": "x-1"})))
        .await;
    lapsed.expect_status(201);
    until_free(app, &path).await;
    let reader = app
        .acquire(
            name,
            Some(json!({"mode": "shared", "ttl_ms": 30_000, "owner": "r"})),
        )
        .await;
    reader.expect_status(201);
    app.release(name, &reader.token()).await.expect_status(204);
    let released = app
        .acquire(name, Some(json!({"ttl_ms": 30_000, "owner": "x-2"})))
        .await;
    released.expect_status(201);
    app.release(name, &released.token())
        .await
        .expect_status(204);
    let held = app
        .acquire(name, Some(json!({"ttl_ms": 30_000, "owner": "x-3"})))
        .await;
    held.expect_status(201);

    let body = history(app, &path).await;
    let seen: Vec<(u64, Value, Value)> = body["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            (
                e["fence"].as_u64().expect("fence"),
                e["owner"].clone(),
                e["ended"].clone(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (held.fence(), json!("x-3"), Value::Null),
            (released.fence(), json!("x-2"), json!("released")),
            (reader.fence(), json!("r"), json!("released")),
            (lapsed.fence(), json!("x-1"), json!("expired")),
        ],
        "{body}"
    );
}

/// A renewal that gives another owner and metadata replaces them in `GET`;
/// the lease's history entry keeps those of its grant, while the lease
/// holds and once it ended (docs/api.md, History).
async fn a_renewal_shows_its_owner_in_get_and_the_grants_in_the_history(app: &TestApp) {
    let name = "hist:renewed";
    let token = "renewal-token-0123456789abcdef";
    let body = |owner: &str, v: &str| json!({"token": token, "ttl_ms": 30_000, "owner": owner, "meta": {"v": v}});
    app.acquire(name, Some(body("grant-owner", "grant")))
        .await
        .expect_status(201);
    app.acquire(name, Some(body("renewal-owner", "renewal")))
        .await
        .expect_status(200);
    let get = app.inspect(name).await.json();
    assert_eq!(get["owner"], "renewal-owner", "{get}");
    assert_eq!(get["meta"], json!({"v": "renewal"}), "{get}");
    let path = format!("/locks/{name}");
    for ended in [Value::Null, json!("released")] {
        if ended == "released" {
            app.release(name, token).await.expect_status(204);
        }
        let body = history(app, &path).await;
        let entry = &body["entries"][0];
        assert_eq!(entry["owner"], "grant-owner", "{body}");
        assert_eq!(entry["meta"], json!({"v": "grant"}), "{body}");
        assert_eq!(entry["ended"], ended, "{body}");
    }
}

/// `POST /runs/{key}` with `body`, and `token` in `Lock-Token` if given.
async fn start_run(
    app: &TestApp,
    key: &str,
    token: Option<&str>,
    body: Value,
) -> crate::support::Reply {
    let headers: Vec<(&str, &str)> = token.map(|t| ("Lock-Token", t)).into_iter().collect();
    app.send_json(Method::POST, &format!("/runs/{key}"), &headers, Some(body))
        .await
}

async fn a_runs_renewal_shows_its_owner_in_get_and_the_starts_in_the_history(app: &TestApp) {
    let key = "hist:run-renewed";
    let path = format!("/runs/{key}");
    let started = start_run(
        app,
        key,
        None,
        json!({"ttl_ms": 30_000, "owner": "start-owner", "meta": {"v": "start"}}),
    )
    .await;
    started.expect_status(201);
    let token = started.token();
    start_run(
        app,
        key,
        Some(&token),
        json!({"ttl_ms": 60_000, "owner": "renewal-owner", "meta": {"v": "renewal"}}),
    )
    .await
    .expect_status(200);
    let get = app.get(&path).await.json();
    assert_eq!(get["owner"], "renewal-owner", "{get}");
    assert_eq!(get["meta"], json!({"v": "renewal"}), "{get}");
    for ended in [Value::Null, json!("completed")] {
        if ended == "completed" {
            app.send_json(
                Method::PUT,
                &format!("{path}/result"),
                &[("Lock-Token", &token)],
                Some(json!({"result": 1})),
            )
            .await
            .expect_status(200);
        }
        let body = history(app, &path).await;
        let entries = body["entries"].as_array().expect("entries");
        assert_eq!(entries.len(), 1, "{body}");
        let entry = &entries[0];
        assert_eq!(entry["fence"].as_u64(), Some(started.fence()), "{body}");
        assert_eq!(entry["owner"], "start-owner", "{body}");
        assert_eq!(entry["meta"], json!({"v": "start"}), "{body}");
        assert_eq!(entry["ended"], ended, "{body}");
        // The renewal moved the lease's end: 60 s past the grant, not 30.
        let granted = entry["granted_at"].as_str().expect("granted_at");
        let expires = entry["expires_at"].as_str().expect("expires_at");
        let span = humantime::parse_rfc3339(expires)
            .unwrap()
            .duration_since(humantime::parse_rfc3339(granted).unwrap())
            .unwrap();
        assert!(span > Duration::from_secs(45), "{body}");
    }
}

async fn a_runs_attempt_that_ran_out_is_in_its_history_with_nobody_taking_over(app: &TestApp) {
    let key = "hist:run-lapsed";
    let path = format!("/runs/{key}");
    let started = start_run(app, key, None, json!({"ttl_ms": 300, "owner": "w"})).await;
    started.expect_status(201);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let body = history(app, &path).await;
        let entries = body["entries"].as_array().expect("entries");
        assert_eq!(entries.len(), 1, "{body}");
        assert_eq!(
            entries[0]["fence"].as_u64(),
            Some(started.fence()),
            "{body}"
        );
        assert_eq!(entries[0]["owner"], "w", "{body}");
        if entries[0]["ended"] == "expired" {
            assert_eq!(entries[0]["ended_at"], entries[0]["expires_at"], "{body}");
            break;
        }
        assert_eq!(entries[0]["ended"], Value::Null, "{body}");
        assert!(Instant::now() < deadline, "never expired: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
