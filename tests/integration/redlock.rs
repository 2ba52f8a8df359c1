//! Redlock: lockd over several independent redis-servers (field cases C09
//! and C12). Every test runs real servers and drives lockd over HTTP; nodes
//! are made unavailable by holding the lock on them as another client
//! would, by SIGSTOP (a node that hangs), by SIGKILL and restart (a node that
//! is refused, then comes back empty), by FLUSHALL, or through a
//! [`LinkProxy`] (a slow node, or a node that hangs with a command in
//! flight). Each node is read directly to check what was left on it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{
    LinkProxy, RedisServer, Reply, TestApp, assert_pttl_since, eventually, metric, random_token,
    samples,
};
use serde_json::json;

/// The node timeout of most tests, in ms: short enough for quick answers
/// when a node hangs, long enough for a loaded machine.
const NODE_TIMEOUT_MS: u64 = 100;

/// The Redlock quorum of `n` nodes.
fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// lockd over `n` fresh nodes with [`NODE_TIMEOUT_MS`].
async fn redlock(n: usize) -> TestApp {
    TestApp::redlock(n, |s| {
        s.store.node_timeout = Duration::from_millis(NODE_TIMEOUT_MS)
    })
    .await
}

/// Checks a 503 `quorum-unavailable` answer: its counts and `Retry-After`.
#[track_caller]
fn expect_quorum_unavailable(reply: &Reply, answered: usize, needed: usize, what: &str) {
    assert_eq!(reply.status, 503, "{what}: {}", reply.text);
    let body = reply.expect_problem(503, "quorum-unavailable");
    assert_eq!(body["nodes_answered"], answered, "{what}: {}", reply.text);
    assert_eq!(body["nodes_needed"], needed, "{what}: {}", reply.text);
    assert!(
        reply
            .header("retry-after")
            .is_some_and(|s| s.parse::<u64>().is_ok_and(|s| s >= 1)),
        "{what}: a 503 says when to retry"
    );
}

/// Takes and releases a lock on every node, so that the pools have a
/// connection to each and the scripts are loaded: later timings then
/// measure the fault, not the first connection.
async fn warm_up(app: &TestApp) {
    let grant = app.acquire_ttl("warm-up", 1_000).await;
    grant.expect_status(201);
    app.release("warm-up", &grant.token())
        .await
        .expect_status(204);
}

// ---------------------------------------------------------------------------
// Quorum, exhaustively
// ---------------------------------------------------------------------------

/// What one node does during an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeState {
    /// Up, lock free.
    Free,
    /// Up, lock held by another client.
    Held,
    /// Frozen with SIGSTOP: accepts connections, never answers.
    Hung,
}

use NodeState::{Free, Held, Hung};

/// For each combination of node states, acquires a fresh lock name and
/// checks the answer: 201 exactly when the free nodes reach a quorum; else
/// 409 when a quorum answered, 503 `quorum-unavailable` when too few did.
/// A refused acquire leaves nothing on any node that answered, and the
/// other client's lock untouched.
async fn check_every_combination(n: usize, combos: &[Vec<NodeState>]) {
    let app = redlock(n).await;
    warm_up(&app).await;
    let q = quorum(n);
    for (i, states) in combos.iter().enumerate() {
        let name = format!("quorum-{i}");
        let what = format!("n={n} nodes={states:?}");
        let foreign = random_token();
        for (node, state) in app.nodes().iter().zip(states) {
            match state {
                Held => node.set_lock(&name, &foreign, 30_000).await,
                Hung => node.sigstop(),
                Free => {}
            }
        }
        let count = |s: NodeState| states.iter().filter(|&&x| x == s).count();
        let (free, answered) = (count(Free), count(Free) + count(Held));

        let reply = app.acquire_ttl(&name, 30_000).await;

        let granted = free >= q;
        if granted {
            assert_eq!(reply.status, 201, "{what}: {}", reply.text);
        } else if answered >= q {
            assert_eq!(reply.status, 409, "{what}: {}", reply.text);
            reply.expect_problem(409, "lock-held");
        } else {
            expect_quorum_unavailable(&reply, answered, q, &what);
        }
        for (j, (node, state)) in app.nodes().iter().zip(states).enumerate() {
            let on_node = match state {
                Hung => continue,
                _ => node.lock_token(&name).await,
            };
            let expected = match state {
                Held => Some(foreign.clone()),
                _ if granted => Some(reply.token()),
                _ => None,
            };
            assert_eq!(on_node, expected, "{what}: lock on node {j}");
            if *state == Free && !granted {
                assert!(!node.has_meta(&name).await, "{what}: metadata on node {j}");
            }
        }
        for (node, state) in app.nodes().iter().zip(states) {
            if *state == Hung {
                node.sigcont();
            }
        }
    }
}

/// Every assignment of `states` to `n` nodes.
fn all_combinations(n: usize, states: &[NodeState]) -> Vec<Vec<NodeState>> {
    let mut combos = vec![vec![]];
    for _ in 0..n {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                states.iter().map(move |s| {
                    let mut c = c.clone();
                    c.push(*s);
                    c
                })
            })
            .collect();
    }
    combos
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_over_3_nodes_succeeds_exactly_when_the_free_nodes_reach_a_quorum() {
    // 27 combinations: each node free, held by another client, or hung.
    check_every_combination(3, &all_combinations(3, &[Free, Held, Hung])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_over_5_nodes_succeeds_exactly_when_the_free_nodes_reach_a_quorum() {
    // Every subset of the 5 nodes made unavailable, once by holding the
    // lock on it and once by hanging it.
    let mut combos = all_combinations(5, &[Free, Held]);
    combos.extend(
        all_combinations(5, &[Free, Hung])
            .into_iter()
            .filter(|c| c.contains(&Hung)),
    );
    check_every_combination(5, &combos).await;
}

// ---------------------------------------------------------------------------
// C12: one dead or hanging node must not fail the lock
// ---------------------------------------------------------------------------

/// Checks a grant's `ttl_ms`: the validity `ttl − elapsed − drift`, with
/// drift `ttl × 0.01 + 2 ms` and elapsed at most `took`.
#[track_caller]
fn expect_validity(grant: &Reply, ttl: u64, took: Duration) {
    let drift = ttl / 100 + 2;
    let validity = grant.u64("ttl_ms");
    let took = u64::try_from(took.as_millis()).unwrap();
    assert!(
        validity <= ttl - drift && validity + took + 2 >= ttl - drift,
        "ttl_ms {validity} for a TTL of {ttl} taken in {took} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c12_redlock_quorum_one_hanging_node_of_3_costs_one_node_timeout_not_the_ttl() {
    let app = redlock(3).await;
    warm_up(&app).await;
    app.node(2).sigstop();

    let started = Instant::now();
    let grant = app.acquire_ttl("k", 10_000).await;
    let took = started.elapsed();
    grant.expect_status(201);
    assert!(
        took < Duration::from_millis(NODE_TIMEOUT_MS + 600),
        "a hanging node cost {took:?} with a {NODE_TIMEOUT_MS} ms node timeout"
    );
    assert!(
        took >= Duration::from_millis(NODE_TIMEOUT_MS),
        "the hanging node's answer was not awaited: {took:?}"
    );
    expect_validity(&grant, 10_000, took);
    let token = grant.token();
    for i in [0, 1] {
        assert_eq!(app.node(i).lock_token("k").await, Some(token.clone()));
    }

    // Release goes on while the node hangs.
    let started = Instant::now();
    app.release("k", &token).await.expect_status(204);
    assert!(started.elapsed() < Duration::from_millis(NODE_TIMEOUT_MS + 600));
    app.node(2).sigcont();
    // The hung node gets the delete from the background retry once it is
    // back (its queued commands and the retry race the test's own look).
    assert_gone_everywhere(&app, "k", 3).await;
}

/// Waits until no node holds `name`.
async fn assert_gone_everywhere(app: &TestApp, name: &str, nodes: usize) {
    let gone = eventually(Duration::from_secs(5), || async {
        for i in 0..nodes {
            if app.node(i).lock_token(name).await.is_some() {
                return false;
            }
        }
        true
    })
    .await;
    let held: Vec<usize> = {
        let mut held = Vec::new();
        for i in 0..nodes {
            if app.node(i).lock_token(name).await.is_some() {
                held.push(i);
            }
        }
        held
    };
    assert!(gone, "nodes {held:?} still hold {name} after the release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c12_redlock_quorum_5_nodes_with_2_cut_off_still_grant() {
    let app = redlock(5).await;
    warm_up(&app).await;
    app.node(1).stop();
    app.node(3).sigstop();

    let started = Instant::now();
    let grant = app.acquire_ttl("k", 10_000).await;
    let took = started.elapsed();
    grant.expect_status(201);
    assert!(
        took < Duration::from_millis(NODE_TIMEOUT_MS + 600),
        "{took:?}"
    );
    expect_validity(&grant, 10_000, took);
    for i in [0, 2, 4] {
        assert_eq!(app.node(i).lock_token("k").await, Some(grant.token()));
    }
    // Another client is refused by the 3 nodes that answered.
    app.acquire_ttl("k", 10_000)
        .await
        .expect_problem(409, "lock-held");

    app.release("k", &grant.token()).await.expect_status(204);
    app.node(3).sigcont();
    app.node(1).start().await;
    assert_gone_everywhere(&app, "k", 5).await;
}

/// Three nodes, node 2 behind a [`LinkProxy`], warmed up.
async fn redlock_with_proxy_on_node_2(
    tweak: impl FnOnce(&mut lockd::config::Settings),
) -> (TestApp, LinkProxy) {
    let nodes: Vec<Arc<RedisServer>> =
        futures::future::join_all((0..3).map(|_| RedisServer::spawn()))
            .await
            .into_iter()
            .map(Arc::new)
            .collect();
    let proxy = LinkProxy::start(nodes[2].port()).await;
    let urls = vec![nodes[0].url(), nodes[1].url(), proxy.url()];
    let app = TestApp::redlock_over(nodes, urls, tweak).await;
    warm_up(&app).await;
    (app, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c12_redlock_quorum_release_reaches_a_node_that_granted_late() {
    let (app, proxy) = redlock_with_proxy_on_node_2(|s| {
        s.store.node_timeout = Duration::from_millis(NODE_TIMEOUT_MS)
    })
    .await;
    // Node 2 hangs with the acquire script in flight: lockd counts it as
    // down and grants on nodes 0 and 1.
    proxy.freeze_on(b"EVAL");
    let grant = app.acquire_ttl("k", 10_000).await;
    grant.expect_status(201);
    assert!(proxy.is_frozen(), "the acquire never reached node 2's link");
    let token = grant.token();

    // Back, node 2 runs the acquire: it holds the lock too, although lockd
    // never heard it grant.
    proxy.thaw();
    let node2 = app.node(2);
    assert!(
        eventually(Duration::from_secs(2), || async {
            node2.lock_token("k").await.as_deref() == Some(token.as_str())
        })
        .await,
        "node 2 never ran the late acquire"
    );

    // The release goes to every node, not only those that granted.
    app.release("k", &token).await.expect_status(204);
    for i in 0..3 {
        assert_eq!(app.node(i).lock_token("k").await, None, "node {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c12_redlock_quorum_refused_acquire_is_deleted_on_a_hung_node_once_it_is_back() {
    let (app, proxy) = redlock_with_proxy_on_node_2(|s| {
        s.store.node_timeout = Duration::from_millis(NODE_TIMEOUT_MS)
    })
    .await;
    let foreign = random_token();
    app.node(0).set_lock("k", &foreign, 30_000).await;
    // Node 1 grants, node 0 is held, node 2 hangs with the acquire in
    // flight: too few grants, a quorum answered → 409.
    proxy.freeze_on(b"EVAL");
    let reply = app.acquire_ttl("k", 10_000).await;
    reply.expect_problem(409, "lock-held");
    assert!(proxy.is_frozen(), "the acquire never reached node 2's link");
    // Node 1's partial grant is gone by the time of the answer.
    assert_eq!(app.node(1).lock_token("k").await, None);
    assert!(!app.node(1).has_meta("k").await);
    assert_eq!(app.node(0).lock_token("k").await, Some(foreign));

    // Back, node 2 runs the late acquire (its fencing counter moves); the
    // delete retried in the background then removes it, long before the
    // 10 s lease would run out.
    let thawed = Instant::now();
    proxy.thaw();
    let node2 = app.node(2);
    assert!(
        eventually(Duration::from_secs(2), || async {
            node2.fence_counter("k").await.is_some()
        })
        .await,
        "node 2 never ran the late acquire"
    );
    assert!(
        eventually(Duration::from_secs(4), || async {
            node2.lock_token("k").await.is_none()
        })
        .await,
        "node 2 still holds the refused grant {:?} after thawing",
        thawed.elapsed()
    );
    assert!(!node2.has_meta("k").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c12_redlock_quorum_release_missed_by_a_hung_node_is_retried_once_it_is_back() {
    let app = redlock(3).await;
    warm_up(&app).await;
    let grant = app.acquire_ttl("k", 10_000).await;
    grant.expect_status(201);
    for i in 0..3 {
        assert_eq!(app.node(i).lock_token("k").await, Some(grant.token()));
    }
    app.node(2).sigstop();
    app.release("k", &grant.token()).await.expect_status(204);
    app.node(2).sigcont();
    let node2 = app.node(2);
    assert!(
        eventually(Duration::from_secs(3), || async {
            node2.lock_token("k").await.is_none()
        })
        .await,
        "node 2 still holds a released lock 3 s after it came back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c12_redlock_quorum_failed_acquire_deletes_its_partial_grant_on_every_node_at_once() {
    let app = redlock(3).await;
    let foreign = random_token();
    app.node(0).set_lock("k", &foreign, 30_000).await;
    app.node(1).set_lock("k", &foreign, 30_000).await;

    let reply = app.acquire_ttl("k", 10_000).await;
    let problem = reply.expect_problem(409, "lock-held");
    let retry_after = problem["retry_after_ms"].as_u64().unwrap();
    assert!(
        retry_after > 20_000 && retry_after <= 30_000,
        "the lock frees when a holder's lease ends: {retry_after} ms"
    );
    // Node 2 granted, and the grant is gone (lock and metadata) by the time
    // of the answer; the other client's locks are untouched.
    assert_eq!(app.node(2).lock_token("k").await, None);
    assert!(!app.node(2).has_meta("k").await);
    for i in [0, 1] {
        assert_eq!(app.node(i).lock_token("k").await, Some(foreign.clone()));
    }
    // The compare-and-delete went to each node once.
    let text = app.metrics().await;
    for i in 0..3 {
        let node = app.node_label(i);
        let releases = metric(
            &text,
            "lockd_backend_duration_seconds_count",
            &[("op", "release"), ("node", &node)],
        );
        assert_eq!(releases, Some(1.0), "releases sent to node {i}");
    }
}

// ---------------------------------------------------------------------------
// C09: a slow node that eats the TTL
// ---------------------------------------------------------------------------

/// The delay the slow node's link adds in each direction.
const SLOW_MS: u64 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c09_redlock_a_slow_node_that_eats_the_ttl_fails_the_acquire_and_cleans_up() {
    // The node timeout is long enough for the slow node's answer (a pool
    // check and a script: two round trips of 2 × SLOW_MS) to be awaited.
    let (app, proxy) =
        redlock_with_proxy_on_node_2(|s| s.store.node_timeout = Duration::from_millis(2_500)).await;
    proxy.set_delay(Duration::from_millis(SLOW_MS));
    let round_trip = Duration::from_millis(2 * SLOW_MS);

    // A TTL of 400 ms leaves no validity once the slow node has answered.
    let started = Instant::now();
    let reply = app.acquire_ttl("k", 400).await;
    let took = started.elapsed();
    // Nobody else holds it: 503, nothing held, never 409 "held".
    let problem = reply.expect_problem(503, "backend-unavailable");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("nothing is held")),
        "a grant with no validity left: {}",
        reply.text
    );
    assert!(
        took >= round_trip,
        "the slow node was not awaited: {took:?}"
    );
    // A holder hash left behind is the history's record of a lease that
    // ran out before its cleanup came: kept at most the fence retention.
    let retention = i64::try_from(app.settings.store.fence_retention.as_millis()).unwrap();
    for i in 0..3 {
        assert_eq!(app.node(i).lock_token("k").await, None, "node {i}");
        let meta_pttl = app
            .node(i)
            .pttl(&format!("{}:meta", crate::support::lock_key("k")))
            .await;
        assert!(
            meta_pttl == -2 || (meta_pttl > 0 && meta_pttl <= retention),
            "node {i}: holder hash PTTL {meta_pttl}"
        );
    }
    // The keys would have run out by now anyway (their lease was 400 ms): what
    // shows the cleanup is that the delete went to every node, the slow one
    // included, and each answered it.
    let text = app.metrics().await;
    for i in 0..3 {
        let node = app.node_label(i);
        let releases = metric(
            &text,
            "lockd_backend_duration_seconds_count",
            &[("op", "release"), ("node", &node)],
        );
        assert_eq!(
            releases,
            Some(2.0),
            "warm-up and cleanup releases on node {i}"
        );
        let errors = metric(&text, "lockd_backend_errors_total", &[("node", &node)]);
        assert_eq!(errors, Some(0.0), "node {i} failed a call");
    }

    // A longer TTL is granted, with the slow node's time taken off the
    // validity.
    let started = Instant::now();
    let grant = app.acquire_ttl("k", 5_000).await;
    let took = started.elapsed();
    grant.expect_status(201);
    expect_validity(&grant, 5_000, took);
    let validity = grant.u64("ttl_ms");
    let slow = u64::try_from(round_trip.as_millis()).unwrap();
    assert!(
        validity <= 5_000 - 52 - slow,
        "ttl_ms {validity} does not count the slow node's {slow} ms"
    );
    app.release("k", &grant.token()).await.expect_status(204);
}

// ---------------------------------------------------------------------------
// Mutual exclusion and fences under faults
// ---------------------------------------------------------------------------

/// What the clients of one lock name saw.
#[derive(Default)]
struct Ledger {
    /// Set by a client from its grant until just before its release.
    held: AtomicBool,
    /// Fences of the grants, in grant order.
    fences: Mutex<Vec<u64>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_clients_hold_a_lock_at_once_while_nodes_are_killed_and_restarted() {
    const RUN: Duration = Duration::from_secs(10);
    const NAMES: [&str; 2] = ["hot-a", "hot-b"];
    let tweak = |s: &mut lockd::config::Settings| s.store.node_timeout = Duration::from_millis(200);
    let first = Arc::new(TestApp::redlock(3, tweak).await);
    let second = Arc::new(first.sibling(tweak).await);
    let ledgers: Arc<Vec<Ledger>> = Arc::new(NAMES.iter().map(|_| Ledger::default()).collect());
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let node_down = Arc::new(AtomicBool::new(false));
    let grants_while_down = Arc::new(AtomicUsize::new(0));
    let quorum_503s = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + RUN;

    let mut clients = Vec::new();
    for client in 0..16 {
        let app = Arc::clone(if client % 2 == 0 { &first } else { &second });
        let which = (client / 2) % NAMES.len();
        let (ledgers, violations) = (ledgers.clone(), violations.clone());
        let (node_down, grants_while_down, quorum_503s) = (
            node_down.clone(),
            grants_while_down.clone(),
            quorum_503s.clone(),
        );
        clients.push(tokio::spawn(async move {
            let (name, ledger) = (NAMES[which], &ledgers[which]);
            let fail = |what: String| violations.lock().unwrap().push(what);
            let mut grants = 0_usize;
            while Instant::now() < deadline {
                let down = node_down.load(Ordering::SeqCst);
                let reply = app
                    .acquire(name, Some(json!({ "ttl_ms": 2_000, "wait_ms": 300 })))
                    .await;
                match reply.status.as_u16() {
                    201 => {
                        grants += 1;
                        let fence = reply.fence();
                        if ledger.held.swap(true, Ordering::SeqCst) {
                            fail(format!("{name}: granted (fence {fence}) while held"));
                        }
                        {
                            let mut fences = ledger.fences.lock().unwrap();
                            if let Some(&last) = fences.last()
                                && fence <= last
                            {
                                fail(format!("{name}: fence {fence} after {last}"));
                            }
                            fences.push(fence);
                        }
                        if down && node_down.load(Ordering::SeqCst) {
                            grants_while_down.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(rand::random_range(2..10))).await;
                        ledger.held.store(false, Ordering::SeqCst);
                        let release = app.release(name, &reply.token()).await;
                        match release.status.as_u16() {
                            204 => {}
                            503 if is_quorum_503(&release) => {
                                quorum_503s.fetch_add(1, Ordering::SeqCst);
                            }
                            s => fail(format!("{name}: release → {s} {}", release.text)),
                        }
                    }
                    409 => {}
                    503 if is_quorum_503(&reply) => {
                        quorum_503s.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    s => fail(format!("{name}: acquire → {s} {}", reply.text)),
                }
            }
            grants
        }));
    }

    // One node at a time is killed, left down, and restarted empty.
    let mut round = 0;
    while Instant::now() + Duration::from_millis(1_500) < deadline {
        let node = first.node(round % 3);
        node.stop();
        node_down.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(700)).await;
        node_down.store(false, Ordering::SeqCst);
        node.start().await;
        tokio::time::sleep(Duration::from_millis(800)).await;
        round += 1;
    }

    let mut grants = 0;
    for client in clients {
        grants += client.await.unwrap();
    }
    let violations = violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    let quorum_503s = quorum_503s.load(Ordering::SeqCst);
    let while_down = grants_while_down.load(Ordering::SeqCst);
    eprintln!(
        "{grants} grants ({while_down} while a node was down) over {round} node restarts; \
         {quorum_503s} quorum 503s"
    );
    assert!(
        round >= 3,
        "only {round} node restarts: not every node was restarted"
    );
    assert!(grants >= 100, "only {grants} grants in {RUN:?}");
    assert!(
        while_down >= 10,
        "only {while_down} grants while a node was down"
    );
    for (name, ledger) in NAMES.iter().zip(ledgers.iter()) {
        assert!(ledger.fences.lock().unwrap().len() >= 20, "{name} starved");
        // No lock is left stuck: each name is free again within a lease.
        first
            .acquire(name, Some(json!({ "ttl_ms": 1_000, "wait_ms": 3_000 })))
            .await
            .expect_status(201);
    }
}

/// Whether a 503 is a `quorum-unavailable` that says too few nodes answered.
fn is_quorum_503(reply: &Reply) -> bool {
    let body = reply.json();
    let (answered, needed) = (
        body["nodes_answered"].as_u64(),
        body["nodes_needed"].as_u64(),
    );
    body["type"] == "urn:lockd:problem:quorum-unavailable"
        && answered.zip(needed).is_some_and(|(a, n)| a < n)
        && reply.header("retry-after").is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_growing_when_a_node_is_flushed_or_restarted_empty_between_grants() {
    let app = TestApp::redlock(3, |s| s.store.node_timeout = Duration::from_millis(300)).await;
    let mut last = 0;
    for round in 0..9 {
        let grant = app.acquire_ttl("f", 10_000).await;
        grant.expect_status(201);
        let fence = grant.fence();
        assert!(fence > last, "round {round}: fence {fence} after {last}");
        last = fence;
        // The fence was written back to every node that granted, the empty
        // one included.
        for i in 0..3 {
            let counter = app.node(i).fence_counter("f").await;
            assert!(
                counter >= Some(fence),
                "round {round}: node {i} counter {counter:?} below fence {fence}"
            );
        }
        let status = app.inspect("f").await;
        status.expect_status(200);
        assert_eq!(status.fence(), fence);
        app.release("f", &grant.token()).await.expect_status(204);
        let node = app.node(round % 3);
        if round % 2 == 0 {
            node.flushall().await;
        } else {
            node.stop();
            node.start().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_keep_growing_when_the_node_shared_by_two_quorums_loses_its_data() {
    let app = redlock(3).await;
    // The first grant's quorum is nodes 0 and 1: node 2 is held by another
    // client (its fencing counter stays at 0).
    let other = random_token();
    app.node(2).set_lock("f", &other, 30_000).await;
    let first = app.acquire_ttl("f", 10_000).await;
    first.expect_status(201);
    app.release("f", &first.token()).await.expect_status(204);
    app.node(2).drop_lock("f").await;

    // Node 1, the only node shared with the next quorum (1 and 2), loses its
    // data: one node of three, a minority.
    app.node(1).flushall().await;
    app.node(0).set_lock("f", &other, 30_000).await;
    let second = app.acquire_ttl("f", 10_000).await;
    second.expect_status(201);
    assert!(
        second.fence() > first.fence(),
        "fence {} after {}",
        second.fence(),
        first.fence()
    );
}

// ---------------------------------------------------------------------------
// Extend, release and inspect by majority
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_succeeds_on_a_quorum_and_otherwise_answers_as_the_majority_says() {
    let app = redlock(3).await;
    warm_up(&app).await;

    // 200 with the validity when a quorum extended, one node hanging.
    let grant = app.acquire_ttl("k", 10_000).await;
    grant.expect_status(201);
    let token = grant.token();
    app.node(2).sigstop();
    let started = Instant::now();
    let extended = app.extend_ttl("k", &token, 5_000).await;
    let took = started.elapsed();
    app.node(2).sigcont();
    extended.expect_status(200);
    assert_eq!(extended.fence(), grant.fence());
    expect_validity(&extended, 5_000, took);
    for i in [0, 1] {
        let pttl = app.node(i).pttl(&crate::support::lock_key("k")).await;
        assert_pttl_since(pttl, 5_000, started);
    }

    // 404 when a majority says nobody holds it (its lease ran out on two
    // nodes): the one node that extended keeps its extension.
    app.node(0).drop_lock("k").await;
    app.node(1).drop_lock("k").await;
    app.extend_ttl("k", &token, 5_000)
        .await
        .expect_problem(404, "lock-not-held");

    // 409 when a majority says another token holds it.
    let grant = app.acquire_ttl("k2", 10_000).await;
    grant.expect_status(201);
    let other = random_token();
    app.node(0).set_lock("k2", &other, 10_000).await;
    app.node(1).set_lock("k2", &other, 10_000).await;
    app.extend_ttl("k2", &grant.token(), 5_000)
        .await
        .expect_problem(409, "not-lock-owner");
    // Nothing changed on the nodes that have the other token.
    assert_eq!(app.node(0).lock_token("k2").await, Some(other));

    // 503 when too few answered, although the one that did extended.
    let grant = app.acquire_ttl("k3", 10_000).await;
    grant.expect_status(201);
    app.node(1).sigstop();
    app.node(2).sigstop();
    let reply = app.extend_ttl("k3", &grant.token(), 5_000).await;
    app.node(1).sigcont();
    app.node(2).sigcont();
    expect_quorum_unavailable(&reply, 1, 2, "extend with 2 of 3 nodes hanging");
    // Back, the quorum extends again.
    app.extend_ttl("k3", &grant.token(), 5_000)
        .await
        .expect_status(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_succeeds_when_a_quorum_deletes_and_otherwise_answers_as_the_majority_says() {
    let app = redlock(3).await;
    warm_up(&app).await;

    // 204 when a quorum still held the token, though one node had lost it.
    let grant = app.acquire_ttl("k", 10_000).await;
    grant.expect_status(201);
    app.node(0).drop_lock("k").await;
    app.release("k", &grant.token()).await.expect_status(204);
    for i in 0..3 {
        assert_eq!(app.node(i).lock_token("k").await, None);
    }

    // 404 when the majority had lost it (the lease was over by Redlock's
    // rule); the copy left on one node is deleted all the same.
    let grant = app.acquire_ttl("k", 10_000).await;
    grant.expect_status(201);
    let token = grant.token();
    app.node(0).drop_lock("k").await;
    app.node(1).drop_lock("k").await;
    app.release("k", &token)
        .await
        .expect_problem(404, "lock-not-held");
    assert_eq!(app.node(2).lock_token("k").await, None);
    // 404 once nobody holds it.
    app.release("k", &token)
        .await
        .expect_problem(404, "lock-not-held");

    // 409 when a majority holds another token; nothing is deleted.
    let grant = app.acquire_ttl("k2", 10_000).await;
    grant.expect_status(201);
    let other = random_token();
    app.node(0).set_lock("k2", &other, 10_000).await;
    app.node(1).set_lock("k2", &other, 10_000).await;
    app.node(2).drop_lock("k2").await;
    app.release("k2", &grant.token())
        .await
        .expect_problem(409, "not-lock-owner");
    for i in [0, 1] {
        assert_eq!(app.node(i).lock_token("k2").await, Some(other.clone()));
    }
    // 404 when the majority says nobody holds it, one node another token.
    app.node(1).drop_lock("k2").await;
    app.release("k2", &grant.token())
        .await
        .expect_problem(404, "lock-not-held");

    // 503 when too few answered and none of them deleted it; the lock is
    // still on the hung nodes, and released once they are back.
    let grant = app.acquire_ttl("k3", 10_000).await;
    grant.expect_status(201);
    app.node(0).drop_lock("k3").await;
    app.node(1).sigstop();
    app.node(2).sigstop();
    let reply = app.release("k3", &grant.token()).await;
    app.node(1).sigcont();
    app.node(2).sigcont();
    expect_quorum_unavailable(&reply, 1, 2, "release with 2 of 3 nodes hanging");
    // The delete is retried in the background on the nodes that hung, so
    // once they are back the lock goes without another request.
    let gone = eventually(Duration::from_secs(5), || async {
        let mut held = 0;
        for i in 0..3 {
            held += usize::from(app.node(i).lock_token("k3").await.is_some());
        }
        held == 0
    })
    .await;
    assert!(gone, "the hung nodes kept the lock after they came back");
    app.release("k3", &grant.token())
        .await
        .expect_problem(404, "lock-not-held");
}

/// A fence far above Redis's clock in µs, and below 2^53.
const OTHER_FENCE: u64 = 9_000_000_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_shows_the_holder_a_majority_agrees_on_with_its_fence() {
    let app = redlock(3).await;
    warm_up(&app).await;
    // Node 2 has another lockd-compatible holder, with a fence above any
    // that Redis's clock gives.
    let other = random_token();
    app.node(2)
        .set_lock_with_meta("k", &other, OTHER_FENCE, "other", 30_000)
        .await;
    let grant = app
        .acquire("k", Some(json!({ "ttl_ms": 30_000, "owner": "mine" })))
        .await;
    grant.expect_status(201);
    assert!(grant.fence() < OTHER_FENCE);

    let status = app.inspect("k").await;
    status.expect_status(200);
    assert_eq!(status.fence(), grant.fence(), "{}", status.text);
    assert_eq!(status.str("owner"), "mine");
    let ttl = status.u64("ttl_ms");
    assert!(ttl > 25_000 && ttl <= 30_000, "ttl_ms {ttl}");

    // Now the other holder has the majority: nodes 1 and 2.
    app.node(1)
        .set_lock_with_meta("k", &other, OTHER_FENCE, "other", 20_000)
        .await;
    let status = app.inspect("k").await;
    status.expect_status(200);
    assert_eq!(status.fence(), OTHER_FENCE, "{}", status.text);
    assert_eq!(status.str("owner"), "other");
    let ttl = status.u64("ttl_ms");
    assert!(ttl <= 20_000, "the shortest lease of the majority: {ttl}");

    // No token on a majority: free, as far as GET can tell.
    app.node(2).drop_lock("k").await;
    app.inspect("k").await.expect_problem(404, "lock-not-held");

    // Too few answered: 503.
    app.node(1).sigstop();
    app.node(2).sigstop();
    let reply = app.inspect("k").await;
    app.node(1).sigcont();
    app.node(2).sigcont();
    expect_quorum_unavailable(&reply, 1, 2, "GET with 2 of 3 nodes hanging");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_shows_a_foreign_holder_that_a_majority_agrees_on() {
    let app = redlock(3).await;
    for i in 0..3 {
        app.node(i).set_lock("k", "job:42 on host-a", 30_000).await;
    }
    app.acquire_ttl("k", 10_000)
        .await
        .expect_problem(409, "lock-held");
    let status = app.inspect("k").await;
    status.expect_status(200);
}

// ---------------------------------------------------------------------------
// Waiting and metrics
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_even_with_a_node_down() {
    let app = Arc::new(redlock(3).await);
    warm_up(&app).await;
    for round in 0..2 {
        if round == 1 {
            // Release events still come from the nodes that are up.
            app.node(0).stop();
        }
        let name = format!("k{round}");
        let holder = app.acquire_ttl(&name, 10_000).await;
        holder.expect_status(201);
        let waiter = {
            let (app, name) = (app.clone(), name.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let reply = app
                    .acquire(&name, Some(json!({ "ttl_ms": 10_000, "wait_ms": 5_000 })))
                    .await;
                (reply, started.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !waiter.is_finished(),
            "round {round}: the waiter did not wait"
        );
        app.release(&name, &holder.token()).await.expect_status(204);
        let (reply, waited) = waiter.await.unwrap();
        reply.expect_status(201);
        assert!(reply.fence() > holder.fence());
        assert!(
            waited < Duration::from_millis(1_500),
            "round {round}: woken after {waited:?}, not by the release at 300 ms"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_one_series_per_node_and_count_node_errors_and_quorum_failures() {
    let app = redlock(3).await;
    let grant = app.acquire_ttl("k", 30_000).await;
    grant.expect_status(201);
    let text = app.metrics().await;
    let mut nodes: Vec<String> = samples(&text)
        .into_iter()
        .filter(|s| {
            s.name == "lockd_backend_duration_seconds_count"
                && s.labels.get("op").map(String::as_str) == Some("acquire")
        })
        .map(|s| s.labels["node"].clone())
        .collect();
    nodes.sort();
    let mut expected: Vec<String> = (0..3).map(|i| app.node_label(i)).collect();
    expected.sort();
    assert_eq!(nodes, expected, "one acquire series per node");
    for node in &expected {
        let calls = metric(
            &text,
            "lockd_backend_duration_seconds_count",
            &[("op", "acquire"), ("node", node)],
        );
        assert_eq!(calls, Some(1.0), "{node}");
    }

    // A stopped node's calls are counted as errors of that node only.
    app.node(2).stop();
    app.acquire_ttl("k2", 30_000).await.expect_status(201);
    let text = app.metrics().await;
    let errors = |text: &str, i: usize| {
        metric(
            text,
            "lockd_backend_errors_total",
            &[("node", &app.node_label(i)), ("kind", "unavailable")],
        )
        .unwrap()
    };
    assert!(errors(&text, 2) >= 1.0);
    assert_eq!(errors(&text, 0), 0.0);
    assert_eq!(errors(&text, 1), 0.0);
    let quorum_failures =
        |text: &str, op: &str| metric(text, "lockd_quorum_failures_total", &[("op", op)]).unwrap();
    for op in ["acquire", "extend", "release", "inspect"] {
        assert_eq!(quorum_failures(&text, op), 0.0, "{op}");
    }

    // With two nodes down, every operation is a quorum failure.
    app.node(1).stop();
    expect_quorum_unavailable(&app.acquire_ttl("k3", 30_000).await, 1, 2, "acquire");
    expect_quorum_unavailable(
        &app.extend_ttl("k", &grant.token(), 30_000).await,
        1,
        2,
        "extend",
    );
    expect_quorum_unavailable(&app.release("k", &random_token()).await, 1, 2, "release");
    expect_quorum_unavailable(&app.inspect("k").await, 1, 2, "inspect");
    let text = app.metrics().await;
    for op in ["acquire", "extend", "release", "inspect"] {
        assert_eq!(quorum_failures(&text, op), 1.0, "{op}");
    }
    assert!(errors(&text, 1) >= 4.0);
    assert_eq!(errors(&text, 0), 0.0);
}
