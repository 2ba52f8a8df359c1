//! `--min-replicas-acked`: grants, extends and releases that must reach replicas
//! (Redis `WAIT`) before they are answered, over a real master with a
//! replica, the shared Redis Cluster, and a Sentinel set.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{
    RedisServer, SentinelSet, TestApp, eventually, lock_key, metric, random_token, shared_cluster,
};

/// A master and one replica of it, in sync.
async fn master_and_replica() -> (Arc<RedisServer>, RedisServer) {
    let master = Arc::new(RedisServer::spawn().await);
    let replica = RedisServer::spawn().await;
    let _: () = replica
        .cmd(redis::cmd("REPLICAOF").arg("127.0.0.1").arg(master.port()))
        .await;
    let synced = eventually(Duration::from_secs(20), || async {
        let info: String = master.cmd(redis::cmd("INFO").arg("replication")).await;
        info.contains("state=online")
    })
    .await;
    assert!(synced, "the replica did not sync");
    (master, replica)
}

/// C17: with `--min-replicas-acked 1` and the only replica unable to
/// acknowledge (SIGSTOP), an acquire answers 503 `replication-lagging`
/// and leaves no lock on the master; an extend answers the same and the
/// old lease stands; a release answers the same (released on the master,
/// a retry gets 404); with the replica back, the next acquire is 201.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_replica_ack_a_wait_that_came_back_short_is_not_a_grant() {
    let (master, replica) = master_and_replica().await;
    let app = TestApp::redis_on(master.clone(), |s| {
        crate::support::with_acks(s, 1);
    })
    .await;
    // The replica acknowledges (the first grant may meet it still settling).
    let mut held = app.acquire_ttl("acked", 30_000).await;
    let settled = eventually(Duration::from_secs(10), || {
        let app = &app;
        async move { app.acquire_ttl("settle", 1_000).await.status == 201 }
    })
    .await;
    assert!(settled, "the replica never acknowledged a grant");
    if held.status != 201 {
        held = app.acquire_ttl("acked", 30_000).await;
    }
    held.expect_status(201);
    let failures = |text: &str, op: &str| {
        metric(text, "lockd_replica_ack_failures_total", &[("op", op)]).unwrap_or(0.0)
    };
    let before = app.metrics().await;

    replica.sigstop();
    let refused = app.acquire_ttl("unacked", 30_000).await;
    let body = refused.expect_problem(503, "replication-lagging");
    assert!(refused.header("retry-after").is_some(), "{}", refused.text);
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("nothing is held")),
        "{}",
        refused.text
    );
    assert_eq!(
        master.lock_token("unacked").await,
        None,
        "the short grant stayed"
    );
    let extend = app.extend_ttl("acked", &held.token(), 60_000).await;
    extend.expect_problem(503, "replication-lagging");
    assert_eq!(master.lock_token("acked").await, Some(held.token()));
    // A release no replica heard of could come back with a failover: 503,
    // so that the client releases again (issue 28, item 2), never a 204.
    let release = app.release("acked", &held.token()).await;
    let body = release.expect_problem(503, "replication-lagging");
    assert!(release.header("retry-after").is_some(), "{}", release.text);
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("release again")),
        "{}",
        release.text
    );
    replica.sigcont();
    // Released on the master all the same: the retry says it is gone.
    app.release("acked", &held.token())
        .await
        .expect_problem(404, "lock-not-held");

    app.acquire_ttl("unacked", 30_000).await.expect_status(201);
    let text = app.metrics().await;
    for op in ["acquire", "extend", "release"] {
        assert_eq!(
            failures(&text, op) - failures(&before, op),
            1.0,
            "{op}: {text}"
        );
    }
}

/// On a cluster, the `WAIT` goes to the master of the lock's slot: with
/// `--min-replicas-acked 1`, names on every master are granted, and each
/// master ran `WAIT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_grant_waits_on_the_master_of_its_slot() {
    let app = TestApp::cluster_with(|s| crate::support::with_acks(s, 1)).await;
    let cluster = shared_cluster();
    let waits = |port: u16| -> u64 {
        cluster
            .cli(port, &["INFO", "commandstats"])
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let masters = cluster.masters();
    let before: Vec<u64> = masters.iter().map(|&m| waits(m)).collect();
    let tag = random_token();
    let mut granted_on = std::collections::BTreeSet::new();
    for i in 0..60 {
        let name = format!("acks-{}-{i}", tag.get(..6).unwrap_or("x"));
        let grant = app.acquire_ttl(&name, 30_000).await;
        grant.expect_status(201);
        granted_on.insert(cluster.master_of(&lock_key(&name)));
        app.release(&name, &grant.token()).await.expect_status(204);
    }
    assert_eq!(granted_on.len(), masters.len());
    for (i, &m) in masters.iter().enumerate() {
        assert!(waits(m) > before[i], "master {m} ran no WAIT");
    }
}

/// With every replica acknowledging (`--min-replicas-acked 2` of 2), no
/// acknowledged grant is lost through `SENTINEL FAILOVER`; with the
/// replicas frozen, a grant is 503 and leaves no lock behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_sentinel_no_acknowledged_grant_is_lost_through_a_failover() {
    let set = Arc::new(SentinelSet::start().await);
    let app = TestApp::sentinel_on(set.clone(), |s| crate::support::with_acks(s, 2)).await;
    let mut held = Vec::new();
    for i in 0..20 {
        let name = format!("kept:{i}");
        let grant = app.acquire_ttl(&name, 60_000).await;
        grant.expect_status(201);
        held.push((name, grant.token()));
    }
    let new = set.fail_over().await;
    for (name, token) in &held {
        assert_eq!(
            set.server(new).lock_token(name).await.as_ref(),
            Some(token),
            "{name} was lost through the failover"
        );
    }

    let replicas: Vec<&RedisServer> = set.servers.iter().filter(|s| s.port() != new).collect();
    // Wait until lockd writes to the new master, and both replicas follow it.
    let ready = eventually(Duration::from_secs(20), || async {
        let info: String = set
            .server(new)
            .cmd(redis::cmd("INFO").arg("replication"))
            .await;
        let online = info.lines().filter(|l| l.contains("state=online")).count();
        let probe = format!("probe:{}", random_token().get(..8).unwrap_or("x"));
        online == 2 && app.acquire_ttl(&probe, 1_000).await.status == 201
    })
    .await;
    assert!(ready, "the new master did not get both replicas back");
    for replica in &replicas {
        replica.sigstop();
    }
    let refused = app.acquire_ttl("frozen", 30_000).await;
    for replica in &replicas {
        replica.sigcont();
    }
    refused.expect_problem(503, "replication-lagging");
    assert_eq!(set.server(new).lock_token("frozen").await, None);
}

/// `--min-replicas-acked` above the replicas there are is said at start-up,
/// naming the master that is short (every grant there would be answered
/// 503): a server with no replica, and a cluster whose masters have 2 each
/// when 3 are asked for. Enough replicas: no warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_replicas_for_min_replicas_acked_is_said_at_start_up() {
    let warned = |stderr: &str| {
        stderr
            .lines()
            .any(|l| l.contains(" WARN ") && l.contains("--min-replicas-acked is"))
    };
    let lone = RedisServer::spawn().await;
    let lockd = crate::support::Lockd::serve(
        &["--redis-url", &lone.url(), "--min-replicas-acked", "1"],
        &[],
    )
    .await;
    let stderr = lockd.stderr();
    assert!(warned(&stderr), "{stderr}");
    assert!(stderr.contains("has 0 replica(s)"), "{stderr}");

    let cluster = tokio::task::spawn_blocking(shared_cluster)
        .await
        .expect("start the cluster");
    let seed = cluster.master_urls()[0].clone();
    for (asked, warns) in [("3", true), ("2", false)] {
        let lockd = crate::support::Lockd::serve(
            &[
                "--redis-mode",
                "cluster",
                "--redis-url",
                &seed,
                "--min-replicas-acked",
                asked,
            ],
            &[],
        )
        .await;
        let stderr = lockd.stderr();
        assert_eq!(warned(&stderr), warns, "{asked}: {stderr}");
        if warns {
            // Every master is named, once.
            for master in cluster.master_urls() {
                let named = format!("the master {}", master.trim_start_matches("redis://"));
                let times = stderr.lines().filter(|l| l.contains(&named)).count();
                assert_eq!(times, 1, "{named}: {stderr}");
            }
        }
    }
}

/// C17 for permits: with `--min-replicas-acked 1` and the replica unable
/// to acknowledge, a new permit answers 503 `replication-lagging` and is
/// given back (nothing is held), an extend answers the same and the old
/// lease stands; with the replica back, the next permit is 201.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c17_replica_ack_a_permit_short_of_acks_is_not_a_grant() {
    let (master, replica) = master_and_replica().await;
    let app = TestApp::redis_on(master.clone(), |s| {
        crate::support::with_acks(s, 1);
    })
    .await;
    let take = |name: &'static str| {
        let app = &app;
        async move {
            app.send_json(
                reqwest::Method::POST,
                &format!("/semaphores/{name}"),
                &[],
                Some(serde_json::json!({"limit": 2, "ttl_ms": 30_000})),
            )
            .await
        }
    };
    let settled = eventually(Duration::from_secs(10), || async {
        take("settle").await.status == 201
    })
    .await;
    assert!(settled, "the replica never acknowledged a permit");
    let held = take("acked").await;
    held.expect_status(201);

    replica.sigstop();
    let refused = take("unacked").await;
    let body = refused.expect_problem(503, "replication-lagging");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("nothing is held")),
        "{}",
        refused.text
    );
    assert_eq!(
        app.get("/semaphores/unacked").await.status,
        404,
        "the short permit stayed"
    );
    let token = held.token();
    let extend = app
        .send_json(
            reqwest::Method::PATCH,
            "/semaphores/acked",
            &[("Lock-Token", token.as_str())],
            Some(serde_json::json!({"ttl_ms": 60_000})),
        )
        .await;
    extend.expect_problem(503, "replication-lagging");
    assert_eq!(app.get("/semaphores/acked").await.u64("holders"), 1);
    let give_back = |token: String| {
        let app = &app;
        async move {
            app.send(
                reqwest::Method::DELETE,
                "/semaphores/acked",
                &[("Lock-Token", token.as_str())],
                None,
            )
            .await
        }
    };
    give_back(token.clone())
        .await
        .expect_problem(503, "replication-lagging");
    replica.sigcont();
    give_back(token)
        .await
        .expect_problem(404, "permit-not-held");
    take("unacked").await.expect_status(201);
}
