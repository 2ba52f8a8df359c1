//! Listings (`GET /locks`, `GET /semaphores`) through HTTP, as a client
//! pages through them: many names held under several prefixes, walked with
//! a small `limit` by following `next_cursor`, compared with the set held
//! (released names absent, no token anywhere), on a real Redis, the memory
//! backend (`--dev`), Redlock (a name listed once, when a majority of nodes
//! agrees on its holder) and a Redis Cluster (every master walked); on
//! Redis, `INFO commandstats` shows `SCAN` and never `KEYS`. Also the bad
//! input (400 problem documents) and API keys (a tenant lists its own
//! prefixes only).

use std::collections::BTreeSet;
use std::path::PathBuf;

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{
    PREFIX, RedisServer, Reply, TestApp, backend_tests, key_entry, random_token, shared_cluster,
};
use lockd::auth::Permission;
use lockd::lock::Kind;
use lockd::lock::listing::{Cursor, Position};

backend_tests!(
    a_walk_lists_every_held_lock_under_the_prefix_and_no_released_one,
    a_walk_lists_the_semaphores_with_permits_held,
    a_walk_lists_the_runs_kept_in_every_state,
    bad_listing_input_is_refused_with_a_problem,
);

/// Every page of a walk of `route` (`/locks` or `/semaphores`) with `query`
/// (such as `prefix=a:&limit=3`), following `next_cursor` until it is
/// `null`: the items of every page, in order. Each page is checked: 200,
/// at most `limit` items, a cursor that is a string or `null`.
async fn walk(
    app: &TestApp,
    route: &str,
    query: &str,
    headers: &[(&str, &str)],
) -> Vec<Vec<Value>> {
    let limit: Option<usize> = query
        .split('&')
        .find_map(|p| p.strip_prefix("limit="))
        .map(|n| n.parse().unwrap());
    let key = route.trim_start_matches('/');
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("{route}?{query}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let reply = app.send(Method::GET, &path, headers, None).await;
        reply.expect_status(200);
        let body = reply.json();
        let items = body[key]
            .as_array()
            .unwrap_or_else(|| panic!("{path}: {}", reply.text))
            .clone();
        if let Some(limit) = limit {
            assert!(items.len() <= limit, "{path}: {} items", items.len());
        }
        pages.push(items);
        match &body["next_cursor"] {
            Value::Null => return pages,
            Value::String(next) => cursor = Some(next.clone()),
            other => panic!("{path}: next_cursor {other}"),
        }
        assert!(pages.len() < 10_000, "the walk never ends");
    }
}

/// The names of a walk's items, each once (a walk may list a name twice).
fn names(pages: &[Vec<Value>]) -> BTreeSet<String> {
    pages
        .iter()
        .flatten()
        .map(|item| item["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Names under three prefixes (and one that only looks like one: `ab`
/// starts with `a` but not with `a:`), `n` each.
fn spread(tag: &str, n: usize) -> Vec<String> {
    let mut all = Vec::new();
    for prefix in ["a:", "b:", "ab"] {
        for i in 0..n {
            all.push(format!("{tag}{prefix}{i}"));
        }
    }
    all
}

/// Acquires every name of `names` for 60 s; returns the tokens.
async fn hold(app: &TestApp, names: &[String]) -> Vec<String> {
    let mut tokens = Vec::new();
    for name in names {
        let grant = app
            .acquire(
                name,
                Some(json!({"ttl_ms": 60_000, "owner": format!("o-{name}")})),
            )
            .await;
        grant.expect_status(201);
        tokens.push(grant.token());
    }
    tokens
}

/// The keys of `INFO commandstats` (`cmdstat_scan`, ...) of a server.
async fn command_stats(server: &RedisServer) -> String {
    server.cmd(::redis::cmd("INFO").arg("commandstats")).await
}

async fn a_walk_lists_every_held_lock_under_the_prefix_and_no_released_one(app: &TestApp) {
    let tag = format!("l{}-", &random_token()[..6]);
    let all = spread(&tag, 12);
    let tokens = hold(app, &all).await;
    // Every third name released again: those are not listed.
    let mut held = BTreeSet::new();
    for (i, (name, token)) in all.iter().zip(&tokens).enumerate() {
        if i % 3 == 0 {
            app.release(name, token).await.expect_status(204);
        } else {
            held.insert(name.clone());
        }
    }
    let under = |p: &str| -> BTreeSet<String> {
        held.iter().filter(|n| n.starts_with(p)).cloned().collect()
    };
    let pages = walk(app, "/locks", &format!("prefix={tag}a:&limit=3"), &[]).await;
    assert_eq!(names(&pages), under(&format!("{tag}a:")));
    assert!(
        pages.len() >= 3,
        "limit 3 over 8 locks takes pages: {pages:?}"
    );
    assert_eq!(
        names(&walk(app, "/locks", &format!("prefix={tag}a&limit=5"), &[]).await),
        under(&format!("{tag}a"))
    );
    assert_eq!(
        names(&walk(app, "/locks", &format!("prefix={tag}&limit=1000"), &[]).await),
        held
    );
    assert_eq!(
        names(&walk(app, "/locks", &format!("prefix={tag}&limit=2"), &[]).await),
        held
    );
    assert_eq!(
        names(&walk(app, "/locks", &format!("prefix={tag}zz"), &[]).await),
        BTreeSet::new()
    );
    // Without a prefix: every held lock, these among them.
    let every = names(&walk(app, "/locks", "limit=7", &[]).await);
    assert!(every.is_superset(&held));
    assert!(
        every
            .iter()
            .all(|n| !n.starts_with(&tag) || held.contains(n))
    );

    // Each item is what GET /locks/{name} shows, and no token anywhere.
    let pages = walk(app, "/locks", &format!("prefix={tag}b:"), &[]).await;
    for item in pages.iter().flatten() {
        let name = item["name"].as_str().unwrap();
        let status = app.inspect(name).await;
        status.expect_status(200);
        assert_eq!(item["fence"], status.json()["fence"], "{name}");
        assert_eq!(item["owner"], format!("o-{name}"));
        assert_eq!(item["granted_at"], status.json()["granted_at"]);
        let ttl = item["ttl_ms"].as_u64().unwrap();
        assert!(ttl > 50_000 && ttl <= 60_000, "{name}: ttl_ms {ttl}");
        assert!(item["expires_at"].is_string());
        let fields: BTreeSet<&str> = item
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            fields,
            BTreeSet::from([
                "name",
                "fence",
                "ttl_ms",
                "expires_at",
                "owner",
                "meta",
                "granted_at",
                "mode",
                "holder_count"
            ])
        );
        assert_eq!(item["mode"], "exclusive");
        assert_eq!(item["holder_count"], 1);
    }
    let text = format!("{pages:?}");
    for token in &tokens {
        assert!(!text.contains(token.as_str()), "a token in a listing");
    }

    if app.is_redis() {
        let stats = command_stats(app.redis_server()).await;
        assert!(stats.contains("cmdstat_scan:"), "{stats}");
        assert!(
            !stats.contains("cmdstat_keys:"),
            "KEYS was called:\n{stats}"
        );
    }
    if app.is_redlock() {
        for node in app.nodes() {
            let stats = command_stats(node).await;
            assert!(stats.contains("cmdstat_scan:"), "{stats}");
            assert!(
                !stats.contains("cmdstat_keys:"),
                "KEYS was called:\n{stats}"
            );
        }
    }
}

async fn take(app: &TestApp, name: &str, limit: u32) -> Reply {
    app.send_json(
        Method::POST,
        &format!("/semaphores/{name}"),
        &[],
        Some(json!({"limit": limit, "ttl_ms": 60_000, "owner": "w"})),
    )
    .await
}

async fn a_walk_lists_the_semaphores_with_permits_held(app: &TestApp) {
    let tag = format!("s{}-", &random_token()[..6]);
    if app.is_redlock() {
        app.get(&format!("/semaphores?prefix={tag}"))
            .await
            .expect_problem(501, "not-implemented");
        return;
    }
    let mut held = BTreeSet::new();
    let mut tokens = Vec::new();
    for i in 0..9 {
        let name = format!("{tag}pool:{i}");
        for _ in 0..(i % 3 + 1) {
            let permit = take(app, &name, 3).await;
            permit.expect_status(201);
            tokens.push(permit.token());
        }
        held.insert(name);
    }
    // A semaphore whose only permit was given back is not listed, nor a
    // lock of the same prefix.
    let gone = format!("{tag}pool:gone");
    let permit = take(app, &gone, 1).await;
    permit.expect_status(201);
    app.send(
        Method::DELETE,
        &format!("/semaphores/{gone}"),
        &[("Lock-Token", &permit.token())],
        None,
    )
    .await
    .expect_status(204);
    app.acquire_ttl(&format!("{tag}pool:lock"), 60_000)
        .await
        .expect_status(201);

    let pages = walk(app, "/semaphores", &format!("prefix={tag}&limit=2"), &[]).await;
    assert_eq!(names(&pages), held);
    for item in pages.iter().flatten() {
        let name = item["name"].as_str().unwrap();
        let i: usize = name.rsplit(':').next().unwrap().parse().unwrap();
        assert_eq!(item["limit"], 3, "{item}");
        assert_eq!(item["holders"], i % 3 + 1, "{item}");
        assert_eq!(item["permits"].as_array().unwrap().len(), i % 3 + 1);
    }
    let text = format!("{pages:?}");
    for token in &tokens {
        assert!(!text.contains(token.as_str()), "a token in a listing");
    }
    // The lock listing does not show semaphores.
    let locks = names(&walk(app, "/locks", &format!("prefix={tag}"), &[]).await);
    assert_eq!(locks, BTreeSet::from([format!("{tag}pool:lock")]));
}

async fn a_walk_lists_the_runs_kept_in_every_state(app: &TestApp) {
    let tag = format!("r{}-", &random_token()[..6]);
    if app.is_redlock() {
        app.get(&format!("/runs?prefix={tag}"))
            .await
            .expect_problem(501, "not-implemented");
        return;
    }
    let start = |key: String| async move {
        let reply = app
            .send_json(
                Method::POST,
                &format!("/runs/{key}"),
                &[],
                Some(json!({"ttl_ms": 60_000, "owner": "w"})),
            )
            .await;
        reply.expect_status(201);
        reply
    };
    let mut expected = std::collections::BTreeMap::new();
    let mut tokens = Vec::new();
    for i in 0..7 {
        let key = format!("{tag}delivery:{i}");
        let attempt = start(key.clone()).await;
        tokens.push(attempt.token());
        let state = match i % 3 {
            0 => "running",
            1 => {
                app.send_json(
                    Method::PUT,
                    &format!("/runs/{key}/result"),
                    &[("Lock-Token", &attempt.token())],
                    Some(json!({"result": {"n": i}})),
                )
                .await
                .expect_status(200);
                "done"
            }
            _ => {
                app.send(
                    Method::DELETE,
                    &format!("/runs/{key}"),
                    &[("Lock-Token", &attempt.token())],
                    None,
                )
                .await
                .expect_status(204);
                "pending"
            }
        };
        expected.insert(key, state.to_owned());
    }
    // A lock of the same prefix is not a run.
    app.acquire_ttl(&format!("{tag}delivery:lock"), 60_000)
        .await
        .expect_status(201);
    let pages = walk(app, "/runs", &format!("prefix={tag}&limit=2"), &[]).await;
    let listed: std::collections::BTreeMap<String, String> = pages
        .iter()
        .flatten()
        .map(|run| {
            (
                run["key"].as_str().unwrap().to_owned(),
                run["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(listed, expected);
    let text = format!("{pages:?}");
    for token in &tokens {
        assert!(!text.contains(token.as_str()), "a token in a listing");
    }
    app.get("/runs?limit=0")
        .await
        .expect_problem(400, "invalid-request");
}

async fn bad_listing_input_is_refused_with_a_problem(app: &TestApp) {
    app.acquire_ttl("bad:1", 60_000).await.expect_status(201);
    app.acquire_ttl("bad:2", 60_000).await.expect_status(201);
    let other_prefix = {
        let reply = app.get("/locks?prefix=bad:&limit=1").await;
        reply.expect_status(200);
        reply.json()["next_cursor"].as_str().map(str::to_owned)
    };
    let mut bad = vec![
        "/locks?prefix=a%20b".to_owned(),
        "/locks?prefix=a*".to_owned(),
        "/locks?prefix=a%7Bb".to_owned(),
        format!("/locks?prefix={}", "x".repeat(201)),
        "/locks?limit=0".to_owned(),
        "/locks?limit=1001".to_owned(),
        "/locks?limit=-1".to_owned(),
        "/locks?limit=5.0".to_owned(),
        "/locks?limit=".to_owned(),
        "/locks?limit=1&limit=2".to_owned(),
        "/locks?cursor=".to_owned(),
        "/locks?cursor=bm90LWEtY3Vyc29y".to_owned(),
        "/locks?cursor=%21%21".to_owned(),
        "/locks?name=x".to_owned(),
        "/semaphores?limit=0".to_owned(),
        "/semaphores?prefix=%C3%A9".to_owned(),
    ];
    // Well-formed cursors with a position no store here can continue from.
    let position = |at| Cursor::new(Kind::Lock, "", 0, at).encode();
    bad.push(format!(
        "/locks?cursor={}",
        position(Position::Node {
            index: 9,
            skipped: 0,
            at: Box::new(Position::Start),
        })
    ));
    bad.push(format!(
        "/locks?cursor={}",
        position(Position::Shard {
            slot: 20_000,
            node: "127.0.0.1:1".into(),
            cursor: Some(1),
            pending: vec![],
        })
    ));
    let cursor = other_prefix.expect("two locks, a page of one: a next cursor");
    {
        // A cursor serves only the listing it came from.
        bad.push(format!("/locks?prefix=other:&cursor={cursor}"));
        bad.push(format!("/semaphores?prefix=bad:&cursor={cursor}"));
        bad.push(format!("/locks?cursor={cursor}"));
    }
    for path in &bad {
        let reply = app.get(path).await;
        if app.is_redlock() && path.starts_with("/semaphores") && reply.status == 501 {
            continue;
        }
        reply.expect_problem(400, "invalid-request");
        assert_eq!(
            reply.header("content-type").as_deref(),
            Some("application/problem+json"),
            "{path}"
        );
    }
}

/// A keys file of `(id, secret, prefixes, permissions)` in a temp dir.
fn keys_file(keys: &[(&str, &str, &[&str], &[Permission])]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.toml");
    let text: String = keys
        .iter()
        .map(|(id, secret, prefixes, perms)| key_entry(id, secret, prefixes, perms, None))
        .collect();
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_key_lists_only_its_own_prefixes() {
    let rw = [Permission::Acquire, Permission::Release, Permission::Read];
    let (admin, a, bc, blind) = (
        random_token(),
        random_token(),
        random_token(),
        random_token(),
    );
    let (_dir, path) = keys_file(&[
        ("admin", &admin, &["*"], &rw),
        ("a", &a, &["a:"], &[Permission::Read]),
        ("bc", &bc, &["c:", "b:", "b:x:"], &[Permission::Read]),
        ("blind", &blind, &["a:"], &[Permission::Acquire]),
    ]);
    let app = TestApp::redis_with(|s| s.auth.keys_file = Some(path)).await;
    let bearer = |secret: &str| format!("Bearer {secret}");
    let admin_h = bearer(&admin);
    let mut held = BTreeSet::new();
    for name in [
        "a:1", "a:2", "a:3", "ab:1", "b:1", "b:x:1", "b:2", "c:1", "c:2", "d:1",
    ] {
        app.send(
            Method::POST,
            &format!("/locks/{name}"),
            &[("Authorization", &admin_h)],
            None,
        )
        .await
        .expect_status(201);
        held.insert(name.to_owned());
    }
    let set = |names: &[&str]| {
        names
            .iter()
            .map(|n| (*n).to_owned())
            .collect::<BTreeSet<_>>()
    };
    let a_h = bearer(&a);
    let auth_a = [("Authorization", a_h.as_str())];
    assert_eq!(
        names(&walk(&app, "/locks", "limit=1", &auth_a).await),
        set(&["a:1", "a:2", "a:3"])
    );
    assert_eq!(
        names(&walk(&app, "/locks", "prefix=a:2", &auth_a).await),
        set(&["a:2"])
    );
    // Wider than its prefix, or beside it: 403, a problem document.
    for query in ["prefix=a", "prefix=b:", "prefix=ab"] {
        app.send(Method::GET, &format!("/locks?{query}"), &auth_a, None)
            .await
            .expect_problem(403, "forbidden");
        app.send(Method::GET, &format!("/semaphores?{query}"), &auth_a, None)
            .await
            .expect_problem(403, "forbidden");
    }
    // Two prefixes (and one under another): walked one after another,
    // each name once.
    let bc_h = bearer(&bc);
    let auth_bc = [("Authorization", bc_h.as_str())];
    let pages = walk(&app, "/locks", "limit=2", &auth_bc).await;
    let listed: Vec<&str> = pages
        .iter()
        .flatten()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed.iter().copied().collect::<BTreeSet<_>>(),
        set(&["b:1", "b:x:1", "b:2", "c:1", "c:2"])
            .iter()
            .map(String::as_str)
            .collect()
    );
    assert_eq!(listed.len(), 5, "each name once: {listed:?}");
    // The admin key (`*`) lists everything.
    let auth_admin = [("Authorization", admin_h.as_str())];
    assert_eq!(
        names(&walk(&app, "/locks", "limit=3", &auth_admin).await),
        held
    );
    // No key, an unknown key: 401; no `read`: 403.
    app.get("/locks").await.expect_problem(401, "unauthorized");
    app.get("/semaphores")
        .await
        .expect_problem(401, "unauthorized");
    let unknown = bearer(&random_token());
    app.send(Method::GET, "/locks", &[("Authorization", &unknown)], None)
        .await
        .expect_problem(401, "unauthorized");
    let blind_h = bearer(&blind);
    app.send(
        Method::GET,
        "/locks?prefix=a:",
        &[("Authorization", &blind_h)],
        None,
    )
    .await
    .expect_problem(403, "forbidden");
    // A cursor of one key's walk gives another key nothing of the first's:
    // it is refused (the names it carries are not the other key's), or
    // continues under the other key's own prefixes.
    let first = app
        .send(Method::GET, "/locks?limit=1", &auth_bc, None)
        .await;
    let cursor = first.json()["next_cursor"].as_str().unwrap().to_owned();
    let stolen = app
        .send(
            Method::GET,
            &format!("/locks?limit=5&cursor={cursor}"),
            &auth_a,
            None,
        )
        .await;
    if stolen.status != 400 {
        stolen.expect_status(200);
        let listed = stolen.json()["locks"].to_string();
        assert!(
            !listed.contains("\"b:") && !listed.contains("\"c:"),
            "{listed}"
        );
    }
}

/// Redlock lists a lock only when a majority of the nodes agrees on its
/// holder, as `GET /locks/{name}` does, and once however many nodes hold
/// it; a node that does not answer is skipped while a quorum is walked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_lists_a_lock_once_when_a_majority_agrees_on_its_holder() {
    let app = TestApp::redlock(3, |s| {
        s.store.node_timeout = std::time::Duration::from_millis(200);
    })
    .await;
    // Through lockd: on all three nodes.
    let mut agreed = BTreeSet::new();
    for i in 0..5 {
        let name = format!("k:all{i}");
        app.acquire_ttl(&name, 60_000).await.expect_status(201);
        agreed.insert(name);
    }
    // A foreign holder on nodes 1 and 2: a majority.
    let other = random_token();
    for node in [1, 2] {
        app.node(node).set_lock("k:maj", &other, 60_000).await;
    }
    agreed.insert("k:maj".to_owned());
    // On node 0 alone, on two nodes under different tokens, on a minority
    // under one token beside another holder on the third: no majority.
    app.node(0).set_lock("k:one", &other, 60_000).await;
    app.node(0)
        .set_lock("k:split", &random_token(), 60_000)
        .await;
    app.node(2)
        .set_lock("k:split", &random_token(), 60_000)
        .await;
    app.node(1)
        .set_lock("k:three", &random_token(), 60_000)
        .await;
    app.node(2)
        .set_lock("k:three", &random_token(), 60_000)
        .await;
    app.node(0)
        .set_lock("k:three", &random_token(), 60_000)
        .await;
    for name in ["k:one", "k:split", "k:three"] {
        app.inspect(name).await.expect_problem(404, "lock-not-held");
    }
    for limit in [1, 2, 100] {
        let pages = walk(&app, "/locks", &format!("prefix=k:&limit={limit}"), &[]).await;
        let listed: Vec<&str> = pages
            .iter()
            .flatten()
            .map(|i| i["name"].as_str().unwrap())
            .collect();
        assert_eq!(names(&pages), agreed, "limit {limit}");
        assert_eq!(
            listed.len(),
            agreed.len(),
            "limit {limit}: each once: {listed:?}"
        );
    }
    for node in app.nodes() {
        let stats = command_stats(node).await;
        assert!(
            !stats.contains("cmdstat_keys:"),
            "KEYS was called:\n{stats}"
        );
    }
    // Node 0 hangs: its turn is skipped, the others still list every lock
    // a majority holds.
    app.node(0).sigstop();
    let pages = walk(&app, "/locks", "prefix=k:&limit=2", &[]).await;
    app.node(0).sigcont();
    assert_eq!(names(&pages), agreed);
    // Two of three hang: 503, the quorum cannot tell.
    app.node(1).sigstop();
    app.node(2).sigstop();
    let reply = app.get("/locks?prefix=k:").await;
    app.node(1).sigcont();
    app.node(2).sigcont();
    reply.expect_problem(503, "quorum-unavailable");
    // No semaphores in Redlock mode.
    app.get("/semaphores")
        .await
        .expect_problem(501, "not-implemented");
}

/// On a Redis Cluster, the walk goes through every master (a `SCAN` on
/// each, never `KEYS`), and lists locks and semaphores of every slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_walk_goes_through_every_master() {
    let app = TestApp::cluster_with(|_| {}).await;
    let cluster = shared_cluster();
    let tag = format!("lc{}-", &random_token()[..6]);
    let all = spread(&tag, 10);
    let tokens = hold(&app, &all).await;
    let mut held = BTreeSet::new();
    let mut masters = BTreeSet::new();
    for (i, (name, token)) in all.iter().zip(&tokens).enumerate() {
        if i % 4 == 0 {
            app.release(name, token).await.expect_status(204);
        } else {
            held.insert(name.clone());
            masters.insert(cluster.master_of(&format!("{PREFIX}{{{name}}}")));
        }
    }
    // Other tests reshard and fail over this shared cluster meanwhile, so
    // the names are checked on the masters that hold them now: at least
    // two, so that the walk must go from one master to the next.
    assert!(
        masters.len() >= 2,
        "the names are on one master only: {masters:?}"
    );
    let masters: Vec<u16> = masters.into_iter().collect();
    let scans_before: Vec<u64> = masters
        .iter()
        .map(|&port| scan_calls(&cluster.cli(port, &["INFO", "commandstats"])))
        .collect();
    for limit in [3, 1000] {
        let pages = walk(&app, "/locks", &format!("prefix={tag}&limit={limit}"), &[]).await;
        assert_eq!(names(&pages), held, "limit {limit}");
    }
    let under_a: BTreeSet<String> = held
        .iter()
        .filter(|n| n.starts_with(&format!("{tag}a:")))
        .cloned()
        .collect();
    assert_eq!(
        names(&walk(&app, "/locks", &format!("prefix={tag}a:&limit=2"), &[]).await),
        under_a
    );
    for (&port, before) in masters.iter().zip(scans_before) {
        let stats = cluster.cli(port, &["INFO", "commandstats"]);
        assert!(
            !stats.contains("cmdstat_keys:"),
            "KEYS was called on {port}:\n{stats}"
        );
        assert!(
            scan_calls(&stats) > before,
            "master {port} was not walked:\n{stats}"
        );
    }
    // Semaphores too.
    let mut pools = BTreeSet::new();
    for i in 0..6 {
        let name = format!("{tag}pool{i}");
        take(&app, &name, 2).await.expect_status(201);
        pools.insert(name);
    }
    let pages = walk(&app, "/semaphores", &format!("prefix={tag}&limit=2"), &[]).await;
    assert_eq!(names(&pages), pools);
}

/// `calls=` of `cmdstat_scan` in an `INFO commandstats` text (0 when
/// absent).
fn scan_calls(stats: &str) -> u64 {
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_scan:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A key of another type under lockd's prefix (a foreign client's) where a
/// lock's, a semaphore's or a run's key would be: each listing leaves that
/// name out and lists the others, where one such key answered every
/// listing with 500 (found by a new-user trial). `GET` of the name itself
/// is still a 500, as any read Redis refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_of_another_type_is_left_out_of_a_listing() {
    let app = TestApp::redis().await;
    let redis = app.redis_server();
    hold(&app, &["stray:lock-ok".to_owned()]).await;
    take(&app, "stray:sem-ok", 2).await.expect_status(201);
    app.send_json(
        Method::POST,
        "/runs/stray:run-ok",
        &[],
        Some(json!({"ttl_ms": 60_000})),
    )
    .await
    .expect_status(201);
    // A hash where the lock's string is, strings where the semaphore's
    // sorted set and the run's hash are.
    redis
        .cmd::<()>(
            ::redis::cmd("HSET")
                .arg(format!("{PREFIX}{{stray:lock-bad}}"))
                .arg("a")
                .arg("b"),
        )
        .await;
    for key in ["sem:{stray:sem-bad}:permits", "run:{stray:run-bad}:record"] {
        redis
            .cmd::<()>(::redis::cmd("SET").arg(format!("{PREFIX}{key}")).arg("x"))
            .await;
    }
    for (route, ok) in [
        ("/locks", "stray:lock-ok"),
        ("/semaphores", "stray:sem-ok"),
        ("/runs", "stray:run-ok"),
    ] {
        let pages = walk(&app, route, "prefix=stray:", &[]).await;
        let listed: BTreeSet<String> = pages
            .iter()
            .flatten()
            .map(|item| {
                item["name"]
                    .as_str()
                    .or_else(|| item["key"].as_str())
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        assert_eq!(listed, BTreeSet::from([ok.to_owned()]), "{route}");
    }
    app.get("/locks/stray:lock-bad")
        .await
        .expect_problem(500, "backend-error");
}
