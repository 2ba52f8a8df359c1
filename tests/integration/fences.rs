//! Fencing tokens that never go backwards, and nothing left in Redis for a
//! free lock: fences come from max(counter + 1, Redis's clock in µs), and
//! the counter expires `fence_retention_ms` after the lock's last grant.
//! Also the lock's own TTL for an extend that names none, and grants that
//! arrive too late to be leases.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::{RedisServer, TestApp, backend_tests, eventually, lock_key};
use serde_json::json;

/// A lock's fence, through a grant and its release.
async fn grant_and_release(app: &TestApp, name: &str) -> u64 {
    let grant = app.acquire_ttl(name, 5000).await;
    grant.expect_status(201);
    app.release(name, &grant.token()).await.expect_status(204);
    grant.fence()
}

/// Waits until lockd grants again after its Redis servers restarted.
async fn until_lockd_reconnects(app: &TestApp) {
    let granted = eventually(Duration::from_secs(5), || async {
        app.acquire_ttl("f:probe", 100).await.status == 201
    })
    .await;
    assert!(granted, "lockd did not reconnect to Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_across_release_flushall_and_a_restart_without_persistence() {
    let app = TestApp::redis().await;
    let redis = app.redis_server();
    let mut fences = vec![
        grant_and_release(&app, "f:1").await,
        grant_and_release(&app, "f:1").await,
    ];
    redis.flushall().await;
    fences.push(grant_and_release(&app, "f:1").await);
    // Killed and started again on the same port, with no persistence:
    // every key is gone.
    redis.stop();
    redis.start().await;
    assert_eq!(redis.keys().await.len(), 0, "a fresh Redis");
    until_lockd_reconnects(&app).await;
    fences.push(grant_and_release(&app, "f:1").await);
    for pair in fences.windows(2) {
        assert!(pair[1] > pair[0], "fences went {fences:?}");
    }
    assert!(fences.iter().all(|f| *f < (1 << 53)), "{fences:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_strictly_increase_when_every_redlock_node_loses_its_data() {
    // With the delayed restart off: the fence alone must hold.
    let app = TestApp::redlock(3, |s| s.store.redlock_restart_delay = Some(Duration::ZERO)).await;
    let mut fences = vec![grant_and_release(&app, "f:r").await];
    for node in app.nodes() {
        node.flushall().await;
    }
    fences.push(grant_and_release(&app, "f:r").await);
    for node in app.nodes() {
        node.stop();
    }
    for node in app.nodes() {
        node.start().await;
    }
    until_lockd_reconnects(&app).await;
    fences.push(grant_and_release(&app, "f:r").await);
    for pair in fences.windows(2) {
        assert!(pair[1] > pair[0], "fences went {fences:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_short_retention_200_released_names_leave_nothing_in_redis() {
    let app = TestApp::redis_with(|s| s.store.fence_retention = Duration::from_millis(1500)).await;
    let redis = app.redis_server();
    for i in 0..200 {
        grant_and_release(&app, &format!("once:{i}")).await;
    }
    let dbsize = || async { redis.cmd::<u64>(&::redis::cmd("DBSIZE")).await };
    assert!(
        dbsize().await > 0,
        "the counters are kept for the retention"
    );
    assert!(
        eventually(Duration::from_secs(5), || async { dbsize().await == 0 }).await,
        "DBSIZE is still {} after the retention",
        dbsize().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_counter_has_a_ttl_after_every_grant_and_a_lock_held_past_it_gets_a_higher_fence()
{
    let app = TestApp::redis_with(|s| s.store.fence_retention = Duration::from_millis(1000)).await;
    let redis = app.redis_server();
    let counter = format!("{}:fence", lock_key("held:long"));
    let grant = app.acquire_ttl("held:long", 10_000).await;
    grant.expect_status(201);
    let pttl = redis.pttl(&counter).await;
    assert!((1..=1000).contains(&pttl), "counter PTTL {pttl}");
    // Held longer than the retention: the counter is gone meanwhile.
    assert!(
        eventually(Duration::from_secs(3), || async {
            redis.pttl(&counter).await == -2
        })
        .await
    );
    app.release("held:long", &grant.token())
        .await
        .expect_status(204);
    let next = app.acquire_ttl("held:long", 10_000).await;
    next.expect_status(201);
    assert!(
        next.fence() > grant.fence(),
        "{} after {}",
        next.fence(),
        grant.fence()
    );
    let pttl = redis.pttl(&counter).await;
    assert!((1..=1000).contains(&pttl), "counter PTTL {pttl}");
    // A renewal with the same token gives the counter no new life and
    // keeps the fence.
    let renewed = app
        .acquire(
            "held:long",
            Some(json!({ "token": next.token(), "ttl_ms": 10_000 })),
        )
        .await;
    renewed.expect_status(200);
    assert_eq!(renewed.fence(), next.fence());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_plain_counter_gets_a_fence_above_it_and_a_ttl() {
    let app = TestApp::redis().await;
    let redis = app.redis_server();
    // As an older lockd left it: a small counter with no TTL.
    let small = format!("{}:fence", lock_key("old:small"));
    redis
        .cmd::<()>(::redis::cmd("SET").arg(&small).arg("7"))
        .await;
    assert_eq!(redis.pttl(&small).await, -1);
    let grant = app.acquire_ttl("old:small", 5000).await;
    grant.expect_status(201);
    assert!(grant.fence() > 7);
    assert!(redis.pttl(&small).await > 0, "the old counter got a TTL");
    // A counter ahead of Redis's clock still wins: counter + 1.
    let ahead = format!("{}:fence", lock_key("old:ahead"));
    let far = grant.fence() + 1_000_000_000_000;
    redis
        .cmd::<()>(::redis::cmd("SET").arg(&ahead).arg(far))
        .await;
    let grant = app.acquire_ttl("old:ahead", 5000).await;
    grant.expect_status(201);
    assert_eq!(grant.fence(), far + 1);
    // A counter at 2^53 - 1 cannot give a fence a JavaScript client keeps
    // exact: refused, and no lock is left half-written.
    let full = format!("{}:fence", lock_key("old:full"));
    redis
        .cmd::<()>(::redis::cmd("SET").arg(&full).arg((1u64 << 53) - 1))
        .await;
    app.acquire_ttl("old:full", 5000)
        .await
        .expect_problem(500, "backend-error");
    assert_eq!(app.holder("old:full").await, None);
}

/// Every grant's fence is unique to it, even when nodes restart empty
/// between grants and the delayed restart is off: grants of one lock made
/// under restarts, flushes and a hung node never share a fence, and each is
/// larger than the one before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_grants_share_a_fence_when_redlock_nodes_restart_empty() {
    let app = TestApp::redlock(3, |s| s.store.redlock_restart_delay = Some(Duration::ZERO)).await;
    let mut fences = Vec::new();
    for round in 0..9 {
        let node = app.node(round % 3);
        match round % 3 {
            0 => node.flushall().await,
            1 => {
                node.stop();
                node.start().await;
            }
            _ => node.sigstop(),
        }
        let mut fence = None;
        for _ in 0..50 {
            let grant = app.acquire_ttl("f:u", 5000).await;
            if grant.status == 201 {
                fence = Some(grant.fence());
                // Left to run out on one node of three when a node hangs:
                // the next round's grant comes after its release.
                app.release("f:u", &grant.token()).await;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if round % 3 == 2 {
            node.sigcont();
        }
        fences.push(fence.unwrap_or_else(|| panic!("round {round}: no grant")));
    }
    let distinct: HashSet<u64> = fences.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        fences.len(),
        "a fence was given twice: {fences:?}"
    );
    for pair in fences.windows(2) {
        assert!(pair[1] > pair[0], "fences went {fences:?}");
    }
}

/// Redlock's delayed restart: two of three nodes restart empty while A
/// holds a lock. B is refused (409 or 503) until the restart delay has
/// passed, never granted while A's lease may last; the gauge shows the
/// nodes in their delay; after it, grants resume with a fence above A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_of_redlock_nodes_restarted_empty_lets_no_second_holder_in_during_the_delay() {
    // The delay defaults to max_ttl_ms: every lease a node may have lost
    // has run out by then.
    let app = TestApp::redlock(3, |s| {
        s.limits.max_ttl = lockd::lock::Ttl::new(3000).expect("a TTL");
        s.limits.default_ttl = lockd::lock::Ttl::new(3000).expect("a TTL");
        s.store.redlock_restart_delay = None;
    })
    .await;
    let a_sent = std::time::Instant::now();
    let a = app.acquire_ttl("leader", 3000).await;
    a.expect_status(201);
    // A holds the lock until at least this long after it sent its request.
    let a_lease = Duration::from_millis(a.u64("ttl_ms"));
    for i in [0, 1] {
        app.node(i).stop();
        app.node(i).start().await;
    }
    let mut refused = 0;
    let mut gauge_seen = false;
    while a_sent.elapsed() + Duration::from_millis(100) < a_lease {
        let b = app.acquire_ttl("leader", 3000).await;
        assert!(
            b.status == 409 || b.status == 503,
            "a second holder got {} {:?} after A's request, while A's lease of {a_lease:?} lasts: {}",
            b.status,
            a_sent.elapsed(),
            b.text
        );
        if b.status == 503 {
            assert!(b.header("retry-after").is_some(), "{b:?}");
            // Three nodes answered; the two in their delay count towards
            // no quorum, and the answer says so rather than "only 1
            // answered".
            let problem = b.expect_problem(503, "quorum-unavailable");
            assert!(
                problem["detail"]
                    .as_str()
                    .unwrap()
                    .contains("restart delay"),
                "{problem}"
            );
        }
        refused += 1;
        gauge_seen |= app
            .metrics()
            .await
            .lines()
            .any(|l| l == "lockd_redlock_nodes_in_restart_delay 2");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused > 5);
    assert!(
        gauge_seen,
        "lockd_redlock_nodes_in_restart_delay never read 2"
    );
    let mut b_fence = None;
    for _ in 0..100 {
        let b = app.acquire_ttl("leader", 3000).await;
        if b.status == 201 {
            b_fence = Some(b.fence());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b_fence = b_fence.expect("grants resume after the restart delay");
    assert!(b_fence > a.fence(), "{b_fence} after {}", a.fence());
    assert!(
        app.metrics()
            .await
            .lines()
            .any(|l| l == "lockd_redlock_nodes_in_restart_delay 0")
    );
}

/// `PATCH` without `ttl_ms` resets the lease to the lock's own TTL (the one
/// it was granted with, or last extended to), not the server's default.
async fn an_extend_without_a_ttl_keeps_the_locks_own_ttl(app: &TestApp) {
    let grant = app.acquire_ttl("own:ttl", 5000).await;
    grant.expect_status(201);
    let token = grant.token();
    let extended = app.extend("own:ttl", &token, None).await;
    extended.expect_status(200);
    let ttl = extended.u64("ttl_ms");
    assert!(
        (4000..=5000).contains(&ttl),
        "ttl_ms {ttl}, not the default 30000"
    );
    app.extend_ttl("own:ttl", &token, 8000)
        .await
        .expect_status(200);
    let again = app.extend("own:ttl", &token, None).await;
    again.expect_status(200);
    let ttl = again.u64("ttl_ms");
    assert!(
        (7000..=8000).contains(&ttl),
        "ttl_ms {ttl} after an extend to 8000"
    );
    assert_eq!(again.fence(), grant.fence());
    let (_, remaining) = app.holder("own:ttl").await.expect("held");
    assert!(remaining <= 8000, "{remaining}");
}

backend_tests!(an_extend_without_a_ttl_keeps_the_locks_own_ttl);

/// A grant that arrives after its lease ran out is no lease: with Redis
/// slow (a link adding 300 ms each way), a 400 ms lease is released again
/// and answered as for a timeout (503, `Retry-After`), and a longer one
/// reports what is left of it, counted from when the script was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_arrives_after_its_lease_is_never_answered_201() {
    let redis = std::sync::Arc::new(RedisServer::spawn().await);
    let proxy = crate::support::LinkProxy::start(redis.port()).await;
    let url = proxy.url();
    let app = TestApp::redis_on(redis.clone(), |s| {
        s.store.redis_urls = vec![url.into()];
        s.store.redis_timeout = Duration::from_millis(3000);
    })
    .await;
    // Connect while the link is fast.
    app.acquire_ttl("slow:warm", 1000).await.expect_status(201);
    proxy.set_delay(Duration::from_millis(300));
    let late = app.acquire_ttl("slow:short", 400).await;
    late.expect_problem(503, "backend-unavailable");
    assert!(late.header("retry-after").is_some());
    assert_eq!(
        redis.lock_token("slow:short").await,
        None,
        "the late grant was left set"
    );
    let sent = std::time::SystemTime::now();
    let grant = app.acquire_ttl("slow:long", 5000).await;
    grant.expect_status(201);
    let ttl = grant.u64("ttl_ms");
    assert!(
        ttl <= 5000 - 500,
        "ttl_ms {ttl}: the time on the wire was not counted"
    );
    assert!(ttl > 3000, "ttl_ms {ttl}");
    let expires = humantime::parse_rfc3339(&grant.str("expires_at")).expect("RFC 3339");
    let lead = expires.duration_since(sent).expect("after the send");
    assert!(
        lead <= Duration::from_millis(5100),
        "expires_at {lead:?} after the request"
    );
}

/// A stalled grant whose connection dies before its compare-and-delete
/// (issue 16's "possible fault": a 503 whose grant stayed set for its
/// TTL): the acquire's answer is held on the link past the Redis timeout,
/// so lockd answers 503 and sends the delete behind it; the link is then
/// cut with the delete still on it. lockd must send the delete again on a
/// new connection, so the grant it answered 503 is gone long before its
/// 10 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_grant_whose_connection_dies_before_its_delete_is_deleted_all_the_same() {
    let redis = std::sync::Arc::new(RedisServer::spawn().await);
    let proxy = crate::support::LinkProxy::start(redis.port()).await;
    let url = proxy.url();
    let app = TestApp::redis_on(redis.clone(), |s| {
        s.store.redis_urls = vec![url.into()];
        s.store.redis_timeout = Duration::from_millis(300);
    })
    .await;
    app.acquire_ttl("cut:warm", 1000).await.expect_status(201);
    // The acquire script's answer: {1, fence}, a fresh grant (the fence
    // as a decimal string).
    proxy.freeze_on_answer(b"*2\r\n:1\r\n$");
    app.acquire_ttl("cut:k", 10_000)
        .await
        .expect_problem(503, "backend-unavailable");
    assert!(proxy.is_frozen(), "the grant's answer was not held");
    assert!(
        redis.lock_token("cut:k").await.is_some(),
        "Redis granted it (lockd never heard)"
    );
    proxy.cut();
    let cut = std::time::Instant::now();
    assert!(
        crate::support::eventually(Duration::from_secs(8), || async {
            redis.lock_token("cut:k").await.is_none()
        })
        .await,
        "the grant answered 503 stayed set after its connection died"
    );
    assert!(cut.elapsed() < Duration::from_secs(8));
}

/// A lock held by nobody after Redis stalls longer than the TTL: the
/// acquire times out (503) while Redis is paused, Redis runs the script
/// when the pause ends, and lockd deletes that grant right after it, on the
/// same connection, instead of giving up one TTL after the 503 and leaving
/// the lock set for a full lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_timed_out_in_a_stalled_redis_is_deleted_when_redis_runs_it() {
    let app = TestApp::redis_with(|s| s.store.redis_timeout = Duration::from_millis(300)).await;
    let redis = app.redis_server();
    app.acquire_ttl("stall:warm", 1000).await.expect_status(201);
    redis
        .cmd::<()>(::redis::cmd("CLIENT").arg("PAUSE").arg(2500).arg("ALL"))
        .await;
    let paused = std::time::Instant::now();
    app.acquire_ttl("stall:k", 1000)
        .await
        .expect_problem(503, "backend-unavailable");
    // The pause ends at 2.5 s; the stalled grant would hold until 3.5 s.
    tokio::time::sleep(Duration::from_millis(2500).saturating_sub(paused.elapsed())).await;
    let mut seen_free_after_pause = false;
    while paused.elapsed() < Duration::from_millis(3300) {
        if paused.elapsed() > Duration::from_millis(2900) {
            seen_free_after_pause = redis.lock_token("stall:k").await.is_none();
            assert!(seen_free_after_pause, "the stalled grant is held by nobody");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen_free_after_pause);
    let calls: String = redis.cmd(::redis::cmd("INFO").arg("commandstats")).await;
    assert!(calls.contains("cmdstat_evalsha"), "{calls}");
}
