//! lockd in cluster mode (`--redis-mode cluster`) over a real Redis Cluster
//! of 3 masters with 2 replicas each, started once and shared by these
//! tests ([`crate::support::shared_cluster`]); each test uses lock names of
//! its own. Also the start-up checks that refuse a cluster's nodes in the
//! other modes, and a plain server as a cluster seed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rand::Rng as _;
use serde_json::json;

use crate::support::{
    Lockd, MASTERS, RedisServer, TestApp, lock_key, lockd, metric, random_token, run,
    shared_cluster,
};

/// A name of `len` characters drawn from every character a lock name may
/// hold (letters, digits and `._-:@`), unique to this run by `tag`.
fn random_name(tag: &str, len: usize) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:@";
    let mut rng = rand::rng();
    let body: String = (0..len)
        .map(|_| char::from(CHARS[rng.random_range(0..CHARS.len())]))
        .collect();
    format!("{tag}{body}")
}

/// Lock names of this run, one served by each master, in master order.
fn one_name_per_master(tag: &str) -> Vec<String> {
    let cluster = shared_cluster();
    let masters = cluster.masters();
    let mut names = vec![None; masters.len()];
    for i in 0.. {
        let name = format!("{tag}{i}");
        let master = cluster.master_of(&lock_key(&name));
        let at = masters.iter().position(|&m| m == master).expect("a master");
        names[at].get_or_insert(name);
        if names.iter().all(Option::is_some) {
            break;
        }
    }
    names.into_iter().flatten().collect()
}

/// C13: on a 3-master cluster, 500 random valid names (every character the
/// name rules allow) are acquired, extended, inspected and released; no
/// answer is a 5xx, the names land on every master, and no master ever
/// answered `CROSSSLOT` (every key a script touches is in the lock's slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_cluster_slot_every_key_a_script_touches_lives_in_the_locks_slot() {
    let app = TestApp::cluster_with(|_| {}).await;
    let cluster = shared_cluster();
    let tag = format!("c13-{}-", random_token().get(..6).unwrap_or("x"));
    let names: Vec<String> = {
        let mut rng = rand::rng();
        (0..500)
            .map(|_| random_name(&tag, rng.random_range(1..=40)))
            .collect()
    };
    let mut on_masters = BTreeSet::new();
    for name in &names {
        let grant = app.acquire_ttl(name, 30_000).await;
        grant.expect_status(201);
        let token = grant.token();
        on_masters.insert(cluster.master_of(&lock_key(name)));
        app.extend_ttl(name, &token, 20_000)
            .await
            .expect_status(200);
        let held = app.inspect(name).await;
        held.expect_status(200);
        assert_eq!(held.fence(), grant.fence(), "{name}");
        app.release(name, &token).await.expect_status(204);
    }
    assert_eq!(
        on_masters.len(),
        MASTERS,
        "the names did not reach every master"
    );
    for port in cluster.masters() {
        let errors = cluster.cli(port, &["INFO", "errorstats"]);
        assert!(
            !errors.contains("CROSSSLOT"),
            "master {port} answered CROSSSLOT:\n{errors}"
        );
    }
}

/// Two lockd instances on one cluster, for a name on each master: one
/// lock, one holder (the other instance gets 409); a waiter on one
/// instance is woken by a release on the other at once, not at the end of
/// its wait or of the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_locks_and_wake_each_others_waiters_on_every_master() {
    let a = TestApp::cluster_with(|_| {}).await;
    let b = a.sibling(|_| {}).await;
    let tag = format!("pair-{}-", random_token().get(..6).unwrap_or("x"));
    for name in one_name_per_master(&tag) {
        let held = a.acquire_ttl(&name, 60_000).await;
        held.expect_status(201);
        b.acquire_ttl(&name, 60_000).await.expect_status(409);
        let waiting = {
            let b_url = b.url(&format!("/locks/{name}"));
            let client = b.client.clone();
            tokio::spawn(async move {
                let sent = Instant::now();
                let answer = client
                    .post(b_url)
                    .json(&json!({"ttl_ms": 10_000, "wait_ms": 20_000}))
                    .send()
                    .await
                    .expect("the waiter's answer");
                (answer.status().as_u16(), sent.elapsed())
            })
        };
        // Let the waiter park on b before the release on a.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released_at = Instant::now();
        a.release(&name, &held.token()).await.expect_status(204);
        let (status, _) = waiting.await.expect("the waiter ran");
        assert_eq!(status, 201, "{name}: the waiter was not granted");
        let woke_after = released_at.elapsed();
        assert!(
            woke_after < Duration::from_secs(2),
            "{name}: the waiter woke {woke_after:?} after the release on the other instance"
        );
    }
}

/// `/readyz` is 200 over a cluster whose every slot is served, and the
/// metrics say which store lockd runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_200_over_a_healthy_cluster_and_the_metrics_name_the_mode() {
    let app = TestApp::cluster_with(|_| {}).await;
    app.get("/readyz").await.expect_status(200);
    let text = app.metrics().await;
    assert_eq!(
        metric(&text, "lockd_store_mode", &[("mode", "cluster")]),
        Some(1.0),
        "{text}"
    );
    assert!(
        metric(&text, "lockd_redis_pool_size", &[("node", "cluster")]).is_some(),
        "{text}"
    );
}

/// C14: Redlock pointed at the three masters of one Redis Cluster refuses
/// to start (exit 2) and names `--redis-mode cluster`, instead of failing
/// request after request with `MOVED`; so does single mode on one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c14_cluster_misuse_redlock_pointed_at_one_clusters_nodes_refuses_to_start() {
    let cluster = tokio::task::spawn_blocking(shared_cluster)
        .await
        .expect("start the cluster");
    let masters = cluster.master_urls();
    let redlock: Vec<&str> = masters
        .iter()
        .flat_map(|url| ["--redis-url", url.as_str()])
        .collect();
    for args in [redlock, vec!["--redis-url", masters[0].as_str()]] {
        let mut cmd = lockd();
        cmd.args(["serve", "--listen", "127.0.0.1:0"]).args(&args);
        let exit = run(cmd).await;
        exit.expect(2);
        assert!(
            exit.stderr.contains("--redis-mode cluster"),
            "{args:?}: {}",
            exit.stderr
        );
    }
}

/// `--redis-mode cluster` over a plain (non-cluster) server refuses to
/// start and says which mode fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_over_a_plain_server_refuses_to_start() {
    let redis = RedisServer::spawn().await;
    let mut cmd = lockd();
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--redis-mode",
        "cluster",
    ])
    .args(["--redis-url", &redis.url()]);
    let exit = run(cmd).await;
    exit.expect(2);
    assert!(
        exit.stderr.contains("not a Redis Cluster node"),
        "{}",
        exit.stderr
    );
}

/// The `lockd` binary in cluster mode, seeded with one replica only: it
/// finds the masters, serves, and a lock taken through it is on the master
/// of its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_in_cluster_mode_finds_the_masters_from_one_seed() {
    let cluster = tokio::task::spawn_blocking(shared_cluster)
        .await
        .expect("start the cluster");
    let masters: BTreeSet<String> = cluster.master_urls().into_iter().collect();
    let replica = cluster
        .urls()
        .into_iter()
        .find(|u| !masters.contains(u))
        .expect("a replica");
    let lockd = Lockd::serve(&["--redis-mode", "cluster", "--redis-url", &replica], &[]).await;
    let name = format!("seed-{}", random_token().get(..8).unwrap_or("x"));
    let client = reqwest::Client::new();
    let grant = client
        .post(lockd.url(&format!("/locks/{name}")))
        .json(&json!({"ttl_ms": 30_000}))
        .send()
        .await
        .expect("acquire");
    assert_eq!(grant.status().as_u16(), 201, "{}", lockd.stderr());
    let grant: serde_json::Value = grant.json().await.expect("JSON");
    let key = lock_key(&name);
    let held = tokio::task::spawn_blocking(move || cluster.get_with_pttl(&key))
        .await
        .expect("read the cluster");
    assert_eq!(
        held.map(|(token, _)| token).as_deref(),
        grant["token"].as_str()
    );
}
