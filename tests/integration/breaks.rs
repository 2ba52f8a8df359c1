//! Breaking a stuck lease (`DELETE ...?force=true`) through HTTP, as an
//! operator would: only a key with `admin` may (403 otherwise, and
//! without API keys unless `--dev`), the answer says whose lease ended,
//! watchers hear `broken`, the history keeps who broke it, the broken
//! holder's extend and release get 404, a waiter is let in at once, and
//! the next grant's fence is larger, so fenced storage refuses the stuck
//! holder's late write. Locks on Redis, memory and Redlock; permits and
//! run attempts on Redis and memory.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lockd::auth::Permission;
use lockd::config::Settings;
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{EventStream, Reply, TestApp, key_entry, metric, random_token};

/// Storage that checks fences, as Kleppmann's article asks of it: a write
/// whose fence is below the largest one seen is refused.
#[derive(Default)]
struct FencedStorage {
    highest: u64,
    writes: Vec<(u64, &'static str)>,
}

impl FencedStorage {
    fn write(&mut self, fence: u64, what: &'static str) -> Result<(), String> {
        if fence < self.highest {
            return Err(format!("fence {fence} is older than {}", self.highest));
        }
        self.highest = fence;
        self.writes.push((fence, what));
        Ok(())
    }
}

/// An operator's key (`read`, `admin`, `metrics`) and a worker's (the lock
/// permissions), in a keys file.
struct Keys {
    ops: String,
    worker: String,
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Keys {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        let (ops, worker) = (random_token(), random_token());
        let text = key_entry(
            "ops",
            &ops,
            &["*"],
            &[Permission::Read, Permission::Admin, Permission::Metrics],
            None,
        ) + &key_entry(
            "worker",
            &worker,
            &["*"],
            &[
                Permission::Acquire,
                Permission::Extend,
                Permission::Release,
                Permission::Read,
            ],
            None,
        );
        std::fs::write(&path, text).unwrap();
        Self {
            ops: format!("Bearer {ops}"),
            worker: format!("Bearer {worker}"),
            _dir: dir,
            path,
        }
    }

    fn apply(&self, settings: &mut Settings) {
        settings.auth.keys_file = Some(self.path.clone());
    }
}

async fn send(
    app: &TestApp,
    method: Method,
    path: &str,
    auth: &str,
    extra: &[(&str, &str)],
    body: Option<Value>,
) -> Reply {
    let mut headers = vec![("Authorization", auth)];
    headers.extend_from_slice(extra);
    app.send_json(method, path, &headers, body).await
}

/// A waiting acquire of `path` (30 s lease, 30 s wait) with `auth`, on its
/// own task: its answer.
fn spawn_waiter(
    app: &TestApp,
    path: &str,
    auth: &str,
) -> tokio::task::JoinHandle<Result<Reply, reqwest::Error>> {
    let request = app
        .client
        .post(app.url(path))
        .header("Authorization", auth)
        .json(&json!({"ttl_ms": 30_000, "wait_ms": 30_000}))
        .timeout(Duration::from_secs(40));
    tokio::spawn(async move { Reply::read(request.send().await?).await })
}

/// Waits until a request waits for a lock on `app` (`lockd_waiters`, read
/// with `auth`, a key with `metrics`), at most 20 s.
async fn until_queued(app: &TestApp, auth: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = send(app, Method::GET, "/metrics", auth, &[], None)
            .await
            .text;
        if metric(&text, "lockd_waiters", &[]).unwrap_or(0.0) >= 1.0 {
            return;
        }
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each store, with the keys.
async fn apps(keys: &Keys) -> Vec<TestApp> {
    vec![
        TestApp::redis_with(|s| keys.apply(s)).await,
        TestApp::memory_with(|s| keys.apply(s)).await,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_breaks_a_stuck_lock_and_its_old_fence_is_refused_on_redis_and_memory() {
    let keys = Keys::new();
    for app in apps(&keys).await {
        a_stuck_lock_is_broken(&app, &keys).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_breaks_a_stuck_lock_on_redlock_on_every_node() {
    let keys = Keys::new();
    let app = TestApp::redlock_conformance(|s| keys.apply(s)).await;
    let name = "brk:redlock";
    let stuck = send(
        &app,
        Method::POST,
        &format!("/locks/{name}?ttl_ms=60000&owner=stuck"),
        &keys.worker,
        &[],
        None,
    )
    .await;
    stuck.expect_status(201);
    let broken = send(
        &app,
        Method::DELETE,
        &format!("/locks/{name}?force=true"),
        &keys.ops,
        &[],
        None,
    )
    .await;
    broken.expect_status(200);
    assert_eq!(
        broken.json()["broken"][0]["fence"].as_u64(),
        Some(stuck.fence())
    );
    for node in app.nodes() {
        assert_eq!(node.lock_token(name).await, None, "a node kept the lock");
    }
    // The stuck holder's extend and release: 404, nobody holds it.
    for method in [Method::PATCH, Method::DELETE] {
        send(
            &app,
            method,
            &format!("/locks/{name}"),
            &keys.worker,
            &[("Lock-Token", &stuck.token())],
            None,
        )
        .await
        .expect_problem(404, "lock-not-held");
    }
    let history = send(
        &app,
        Method::GET,
        &format!("/locks/{name}/history"),
        &keys.ops,
        &[],
        None,
    )
    .await
    .json();
    assert_eq!(history["entries"][0]["ended"], "broken", "{history}");
    assert_eq!(history["entries"][0]["broken_by"], "ops", "{history}");
    let next = send(
        &app,
        Method::POST,
        &format!("/locks/{name}"),
        &keys.worker,
        &[],
        None,
    )
    .await;
    next.expect_status(201);
    assert!(next.fence() > stuck.fence());
    // Redlock keeps no semaphores: their break is refused as they are.
    send(
        &app,
        Method::DELETE,
        "/semaphores/brk:sem?force=true",
        &keys.ops,
        &[],
        None,
    )
    .await
    .expect_problem(501, "not-implemented");
}

async fn a_stuck_lock_is_broken(app: &TestApp, keys: &Keys) {
    let name = "brk:stuck";
    let path = format!("/locks/{name}");
    let mut storage = FencedStorage::default();
    let stuck = send(
        app,
        Method::POST,
        &path,
        &keys.worker,
        &[],
        Some(json!({"ttl_ms": 60_000, "owner": "batch-7", "meta": {"host": "worker-3"}})),
    )
    .await;
    stuck.expect_status(201);
    let (token, old_fence) = (stuck.token(), stuck.fence());
    storage.write(old_fence, "stuck holder, before").unwrap();

    let mut events = EventStream::open(
        app,
        &format!("{path}/events"),
        &[("Authorization", &keys.ops)],
    )
    .await;
    events.expect("state").await;
    // Someone waits for it, as a job's next run would.
    let waiter = spawn_waiter(app, &path, &keys.worker);
    // The waiter is queued when the lock's contention is counted.
    until_queued(app, &keys.ops).await;

    let broken_at = Instant::now();
    let broken = send(
        app,
        Method::DELETE,
        &format!("{path}?force=true"),
        &keys.ops,
        &[],
        None,
    )
    .await;
    broken.expect_status(200);
    let body = broken.json();
    assert_eq!(
        body,
        json!({"name": name, "broken": [{"fence": old_fence, "mode": "exclusive", "owner": "batch-7", "meta": {"host": "worker-3"}}]})
    );
    let event = events.expect("broken").await;
    assert_eq!(event.data["fence"].as_u64(), Some(old_fence));
    assert_eq!(event.data["broken_by"], "ops");

    // The waiter gets the lock now, not at the stuck lease's end (60 s).
    let next = waiter.await.unwrap().expect("an answer");
    next.expect_status(201);
    assert!(
        broken_at.elapsed() < Duration::from_secs(30),
        "the waiter was let in only after {:?}",
        broken_at.elapsed()
    );
    assert!(next.fence() > old_fence, "the next grant's fence is larger");
    storage.write(next.fence(), "next holder").unwrap();

    // The stuck holder wakes up: its extend and release are refused (409:
    // the waiter holds the lock now; 404 when nobody does), and its late
    // write with the old fence too.
    send(
        app,
        Method::PATCH,
        &path,
        &keys.worker,
        &[("Lock-Token", &token)],
        None,
    )
    .await
    .expect_problem(409, "not-lock-owner");
    send(
        app,
        Method::DELETE,
        &path,
        &keys.worker,
        &[("Lock-Token", &token)],
        None,
    )
    .await
    .expect_problem(409, "not-lock-owner");
    assert!(storage.write(old_fence, "stuck holder, late").is_err());
    assert_eq!(storage.writes.len(), 2);

    let history = send(
        app,
        Method::GET,
        &format!("{path}/history"),
        &keys.ops,
        &[],
        None,
    )
    .await
    .json();
    let entry = &history["entries"][1];
    assert_eq!(entry["fence"].as_u64(), Some(old_fence), "{history}");
    assert_eq!(entry["ended"], "broken", "{history}");
    assert_eq!(entry["broken_by"], "ops", "{history}");
    assert_eq!(entry["owner"], "batch-7");

    let text = send(app, Method::GET, "/metrics", &keys.ops, &[], None)
        .await
        .text;
    assert_eq!(
        metric(&text, "lockd_breaks_total", &[("kind", "lock")]),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_without_admin_is_403_and_keeps_the_lease() {
    let keys = Keys::new();
    let app = TestApp::redis_with(|s| keys.apply(s)).await;
    let grant = send(
        &app,
        Method::POST,
        "/locks/brk:kept",
        &keys.worker,
        &[],
        None,
    )
    .await;
    grant.expect_status(201);
    let refused = send(
        &app,
        Method::DELETE,
        "/locks/brk:kept?force=true",
        &keys.worker,
        &[],
        None,
    )
    .await;
    let problem = refused.expect_problem(403, "forbidden");
    assert!(
        problem["detail"].as_str().unwrap().contains("admin"),
        "{problem}"
    );
    // `force=TRUE` is no way around it: refused as a break, not a release.
    send(
        &app,
        Method::DELETE,
        "/locks/brk:kept?force=TRUE",
        &keys.worker,
        &[("Lock-Token", &grant.token())],
        None,
    )
    .await
    .expect_problem(403, "forbidden");
    assert_eq!(app.holder_token("brk:kept").await, Some(grant.token()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_without_api_keys_is_403_but_in_dev_mode() {
    for app in [TestApp::redis().await, TestApp::memory().await] {
        let grant = app.acquire_ttl("brk:open", 60_000).await;
        grant.expect_status(201);
        let problem = app
            .send(Method::DELETE, "/locks/brk:open?force=true", &[], None)
            .await
            .expect_problem(403, "forbidden");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("--auth-keys-file"),
            "{problem}"
        );
        app.inspect("brk:open").await.expect_status(200);
    }
    let dev = TestApp::memory_with(|s| s.store.dev = true).await;
    dev.acquire_ttl("brk:dev", 60_000).await.expect_status(201);
    dev.send(Method::DELETE, "/locks/brk:dev?force=true", &[], None)
        .await
        .expect_status(200);
    let history = dev.get("/locks/brk:dev/history").await.json();
    assert_eq!(history["entries"][0]["broken_by"], "dev", "{history}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_with_a_token_or_a_bad_query_is_400_and_changes_nothing() {
    let keys = Keys::new();
    let app = TestApp::redis_with(|s| keys.apply(s)).await;
    let grant = send(
        &app,
        Method::POST,
        "/locks/brk:bad",
        &keys.worker,
        &[],
        None,
    )
    .await;
    grant.expect_status(201);
    let token = grant.token();
    for (query, headers) in [
        ("force=true", vec![("Lock-Token", token.as_str())]),
        ("force=yes", vec![]),
        ("force=true&fence=x", vec![]),
        ("force=true&other=1", vec![]),
    ] {
        send(
            &app,
            Method::DELETE,
            &format!("/locks/brk:bad?{query}"),
            &keys.ops,
            &headers,
            None,
        )
        .await
        .expect_problem(400, "invalid-request");
    }
    // A holder's release that names a fence is refused too.
    send(
        &app,
        Method::DELETE,
        "/locks/brk:bad?fence=1",
        &keys.worker,
        &[("Lock-Token", &token)],
        None,
    )
    .await
    .expect_problem(400, "invalid-request");
    assert_eq!(app.holder_token("brk:bad").await, Some(token));
    // A fence no lease has breaks nothing.
    send(
        &app,
        Method::DELETE,
        "/locks/brk:bad?force=true&fence=1",
        &keys.ops,
        &[],
        None,
    )
    .await
    .expect_problem(404, "lock-not-held");
    send(
        &app,
        Method::DELETE,
        "/locks/brk:free?force=true",
        &keys.ops,
        &[],
        None,
    )
    .await
    .expect_problem(404, "lock-not-held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_permit_or_every_permit_or_one_shared_lease_can_be_broken() {
    let keys = Keys::new();
    for app in apps(&keys).await {
        let take = |owner: &'static str| {
            let app = &app;
            let keys = &keys;
            async move {
                let reply = send(
                    app,
                    Method::POST,
                    "/semaphores/brk:pool",
                    &keys.worker,
                    &[],
                    Some(json!({"limit": 3, "ttl_ms": 60_000, "owner": owner})),
                )
                .await;
                reply.expect_status(201);
                reply
            }
        };
        let (a, b, c) = (take("a").await, take("b").await, take("c").await);
        let one = send(
            &app,
            Method::DELETE,
            &format!("/semaphores/brk:pool?force=true&fence={}", b.fence()),
            &keys.ops,
            &[],
            None,
        )
        .await;
        one.expect_status(200);
        assert_eq!(
            one.json()["broken"],
            json!([{"fence": b.fence(), "owner": "b", "meta": null}])
        );
        send(
            &app,
            Method::PATCH,
            "/semaphores/brk:pool",
            &keys.worker,
            &[("Lock-Token", &b.token())],
            None,
        )
        .await
        .expect_problem(404, "permit-not-held");
        let permits = send(
            &app,
            Method::GET,
            "/semaphores/brk:pool",
            &keys.ops,
            &[],
            None,
        )
        .await
        .json();
        assert_eq!(permits["permits"].as_array().unwrap().len(), 2, "{permits}");
        let rest = send(
            &app,
            Method::DELETE,
            "/semaphores/brk:pool?force=true",
            &keys.ops,
            &[],
            None,
        )
        .await;
        rest.expect_status(200);
        let mut fences: Vec<u64> = rest.json()["broken"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["fence"].as_u64().unwrap())
            .collect();
        fences.sort_unstable();
        assert_eq!(fences, [a.fence(), c.fence()]);
        send(
            &app,
            Method::GET,
            "/semaphores/brk:pool",
            &keys.ops,
            &[],
            None,
        )
        .await
        .expect_status(404);
        send(
            &app,
            Method::DELETE,
            "/semaphores/brk:pool?force=true",
            &keys.ops,
            &[],
            None,
        )
        .await
        .expect_problem(404, "permit-not-held");

        // One shared lease of a lock, by its fence: the other reader stays.
        let mut readers = Vec::new();
        for owner in ["r-1", "r-2"] {
            let reply = send(
                &app,
                Method::POST,
                "/locks/brk:shared",
                &keys.worker,
                &[],
                Some(json!({"mode": "shared", "owner": owner})),
            )
            .await;
            reply.expect_status(201);
            readers.push(reply);
        }
        let one = send(
            &app,
            Method::DELETE,
            &format!("/locks/brk:shared?force=true&fence={}", readers[0].fence()),
            &keys.ops,
            &[],
            None,
        )
        .await;
        assert_eq!(one.json()["broken"][0]["mode"], "shared", "{}", one.text);
        let status = send(&app, Method::GET, "/locks/brk:shared", &keys.ops, &[], None)
            .await
            .json();
        assert_eq!(status["holder_count"], 1, "{status}");
        assert_eq!(status["fence"].as_u64(), Some(readers[1].fence()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_run_attempt_lets_the_next_start_run_the_job() {
    let keys = Keys::new();
    for app in apps(&keys).await {
        let key = "brk:delivery";
        let stuck = send(
            &app,
            Method::POST,
            &format!("/runs/{key}?ttl_ms=600000&owner=w1"),
            &keys.worker,
            &[],
            None,
        )
        .await;
        stuck.expect_status(201);
        send(
            &app,
            Method::POST,
            &format!("/runs/{key}"),
            &keys.worker,
            &[],
            None,
        )
        .await
        .expect_problem(409, "run-in-progress");
        let broken = send(
            &app,
            Method::DELETE,
            &format!("/runs/{key}?force=true"),
            &keys.ops,
            &[],
            None,
        )
        .await;
        broken.expect_status(200);
        assert_eq!(broken.json()["key"], key);
        // The stuck attempt cannot store a result any more.
        send(
            &app,
            Method::PUT,
            &format!("/runs/{key}/result"),
            &keys.worker,
            &[("Lock-Token", &stuck.token())],
            Some(json!({"result": 1})),
        )
        .await
        .expect_problem(409, "not-run-owner");
        let next = send(
            &app,
            Method::POST,
            &format!("/runs/{key}"),
            &keys.worker,
            &[],
            None,
        )
        .await;
        next.expect_status(201);
        assert!(next.fence() > stuck.fence());
        let history = send(
            &app,
            Method::GET,
            &format!("/runs/{key}/history"),
            &keys.ops,
            &[],
            None,
        )
        .await
        .json();
        assert_eq!(history["entries"][1]["ended"], "broken", "{history}");
        send(
            &app,
            Method::DELETE,
            "/runs/brk:never?force=true",
            &keys.ops,
            &[],
            None,
        )
        .await
        .expect_problem(404, "run-not-found");
    }
}

/// C13, for the new scripts: a break and a history read on a Redis
/// Cluster touch only the keys of the name's slot (a key elsewhere would
/// be refused with CROSSSLOT), and a waiter on the cluster is woken by the
/// break's sharded message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_breaks_and_histories_stay_in_the_names_slot_on_a_cluster() {
    let keys = Keys::new();
    let app = TestApp::cluster_with(|s| keys.apply(s)).await;
    let name = format!("brk:cluster-{}", random_token());
    let path = format!("/locks/{name}");
    let stuck = send(
        &app,
        Method::POST,
        &format!("{path}?ttl_ms=60000&owner=stuck"),
        &keys.worker,
        &[],
        None,
    )
    .await;
    stuck.expect_status(201);
    let waiter = spawn_waiter(&app, &path, &keys.worker);
    // Once it waits (its first try found the lock held), break the lock.
    until_queued(&app, &keys.ops).await;
    let broken_at = Instant::now();
    send(
        &app,
        Method::DELETE,
        &format!("{path}?force=true"),
        &keys.ops,
        &[],
        None,
    )
    .await
    .expect_status(200);
    let next = waiter.await.unwrap().expect("an answer");
    next.expect_status(201);
    assert!(
        broken_at.elapsed() < Duration::from_secs(30),
        "woken after {:?}",
        broken_at.elapsed()
    );
    let history = send(
        &app,
        Method::GET,
        &format!("{path}/history"),
        &keys.ops,
        &[],
        None,
    )
    .await
    .json();
    let ends: Vec<&Value> = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["ended"])
        .collect();
    assert_eq!(ends, [&Value::Null, &json!("broken")], "{history}");
}
