//! lockd in cluster mode (`--redis-mode cluster`) over a real Redis Cluster
//! of 3 masters with 2 replicas each, started once and shared by these
//! tests ([`crate::support::shared_cluster`]); each test uses lock names of
//! its own. Also the start-up checks that refuse a cluster's nodes in the
//! other modes, and a plain server as a cluster seed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng as _;
use serde_json::json;

use crate::support::{
    Lockd, MASTERS, PREFIX, RedisServer, TestApp, eventually, lock_key, lockd, metric,
    random_token, run, shared_cluster,
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
    one_name_per_master_of(&shared_cluster(), tag)
}

/// C13: on a 3-master cluster, 500 random valid names (every character the
/// name rules allow) are acquired, extended, inspected and released, as
/// locks and as semaphores (a permit taken, extended, listed, given back); no
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
        // The same name as a semaphore: take, extend, list, give back.
        let path = format!("/semaphores/{name}");
        let body = |b: serde_json::Value| Some(b);
        let permit = app
            .send_json(
                reqwest::Method::POST,
                &path,
                &[],
                body(serde_json::json!({"limit": 2})),
            )
            .await;
        permit.expect_status(201);
        let token = permit.token();
        on_masters.insert(cluster.master_of(&format!("{PREFIX}sem:{{{name}}}:permits")));
        let headers = [("Lock-Token", token.as_str())];
        app.send_json(
            reqwest::Method::PATCH,
            &path,
            &headers,
            body(serde_json::json!({"ttl_ms": 20_000})),
        )
        .await
        .expect_status(200);
        let listed = app.get(&path).await;
        listed.expect_status(200);
        assert_eq!(listed.u64("holders"), 1, "{name}");
        app.send(reqwest::Method::DELETE, &path, &headers, None)
            .await
            .expect_status(204);
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
        let waiting = b.spawn_wait(&name, 10_000, 20_000);
        // Let the waiter park on b before the release on a.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released_at = Instant::now();
        a.release(&name, &held.token()).await.expect_status(204);
        let answer = waiting.await.expect("the waiter ran");
        let status = answer.expect("the waiter's answer").status;
        assert_eq!(status, 201, "{name}: the waiter was not granted");
        let woke_after = released_at.elapsed();
        assert!(
            woke_after < Duration::from_secs(2),
            "{name}: the waiter woke {woke_after:?} after the release on the other instance"
        );
    }
}

/// Release events travel by sharded pub/sub: an instance subscribes to a
/// lock's channel (`SSUBSCRIBE`) on the master of its slot only while one
/// of its waiters found the lock held, never with a pattern, and drops the
/// subscription when its last waiter leaves. A wait that gets a free lock
/// subscribes to nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_events_are_sharded_and_subscribed_only_while_someone_waits() {
    let app = TestApp::cluster_with(|_| {}).await;
    let cluster = shared_cluster();
    let tag = format!("shard-{}-", random_token().get(..6).unwrap_or("x"));
    for name in one_name_per_master(&tag) {
        let channel = format!("{}:released", lock_key(&name));
        let owner = cluster.master_of(&lock_key(&name));
        let free = app
            .acquire(&name, Some(json!({"ttl_ms": 30_000, "wait_ms": 5_000})))
            .await;
        free.expect_status(201);
        assert_eq!(
            cluster.shard_subscribers(owner, &channel),
            0,
            "{name}: a wait that got a free lock subscribed"
        );
        let waiting = app.spawn_wait(&name, 10_000, 20_000);
        assert!(
            eventually(Duration::from_secs(5), || async {
                cluster.shard_subscribers(owner, &channel) == 1
            })
            .await,
            "{name}: no SSUBSCRIBE on its master {owner} while a waiter waits"
        );
        for port in cluster.masters().into_iter().filter(|&p| p != owner) {
            assert_eq!(
                cluster.shard_subscribers(port, &channel),
                0,
                "{name} on {port}"
            );
        }
        for port in cluster.masters() {
            assert_eq!(
                cluster.pattern_subscriptions(port),
                0,
                "PSUBSCRIBE on {port}"
            );
        }
        app.release(&name, &free.token()).await.expect_status(204);
        let answer = waiting.await.expect("the waiter ran");
        assert_eq!(answer.expect("the waiter's answer").status, 201, "{name}");
        assert!(
            eventually(Duration::from_secs(5), || async {
                cluster.shard_subscribers(owner, &channel) == 0
            })
            .await,
            "{name}: still subscribed after its last waiter left"
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

/// The ledger of one hot name: whether a client holds it now, and the
/// fences granted, in order.
#[derive(Default)]
struct Ledger {
    held: std::sync::atomic::AtomicBool,
    fences: std::sync::Mutex<Vec<u64>>,
}

/// A private cluster under load from two lockd instances with
/// `--min-replicas-acked 1`, on hot names on every master: first a
/// `redis-cli --cluster reshard` moves the slots of one hot name to another
/// master, then a master is killed until a replica takes over. Through it
/// all every answer is a 2xx, 404, 409 or 503 with `Retry-After`; never two
/// holders at once; each name's fences keep growing; and grants come back
/// within 30 s of each change (a bound a busy machine meets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reshard_and_a_master_kill_under_load_keep_one_holder_and_growing_fences() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let cluster = Arc::new(crate::support::Cluster::start());
    let acks = |s: &mut lockd::config::Settings| {
        crate::support::with_acks(s, 1);
        long_waits(s);
    };
    let a = Arc::new(TestApp::cluster_on(cluster.clone(), acks).await);
    let b = Arc::new(a.sibling(acks).await);
    let masters = cluster.masters();
    // A hot name in the first 50 slots of the first master (the slots a
    // reshard of 50 moves first), and one on each other master.
    let moved = (0..)
        .map(|i| format!("hot-moved-{i}"))
        .find(|n| {
            let slot = cluster.slot(&lock_key(n));
            let first = cluster.first_slot_of(masters[0]);
            (first..first + 50).contains(&slot)
        })
        .expect("a name in the first slots");
    let mut names = vec![moved.clone()];
    names.extend(one_name_per_master_of(&cluster, "hot-"));
    let ledgers: Arc<Vec<Ledger>> = Arc::new(names.iter().map(|_| Ledger::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut clients = Vec::new();
    for client in 0..8 {
        let app = if client % 2 == 0 {
            a.clone()
        } else {
            b.clone()
        };
        let which = client % names.len();
        let name = names[which].clone();
        let (ledgers, stop, violations) = (ledgers.clone(), stop.clone(), violations.clone());
        clients.push(tokio::spawn(async move {
            let ledger = &ledgers[which];
            let fail = |what: String| violations.lock().unwrap().push(what);
            while !stop.load(Ordering::SeqCst) {
                let reply = app
                    .acquire(&name, Some(json!({"ttl_ms": 3_000, "wait_ms": 200})))
                    .await;
                match reply.status.as_u16() {
                    201 => {
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
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        ledger.held.store(false, Ordering::SeqCst);
                        let release = app.release(&name, &reply.token()).await;
                        match release.status.as_u16() {
                            204 | 404 => {}
                            503 if release.header("retry-after").is_some() => {}
                            s => fail(format!("{name}: release → {s} {}", release.text)),
                        }
                    }
                    409 => {}
                    503 if reply.header("retry-after").is_some() => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    s => fail(format!("{name}: acquire → {s} {}", reply.text)),
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A waiter on b, parked on a lock a holds, in the slots the reshard
    // moves; another on the master that is killed. Each must be woken by
    // a's release after the change (its subscription followed the slot).
    let parked_moved = (0..)
        .map(|i| format!("parked-moved-{i}"))
        .find(|n| {
            let slot = cluster.slot(&lock_key(n));
            let first = cluster.first_slot_of(masters[0]);
            (first..first + 50).contains(&slot)
        })
        .expect("a name in the first slots");
    let parked_killed = (0..)
        .map(|i| format!("parked-killed-{i}"))
        .find(|n| cluster.master_of(&lock_key(n)) == masters[2])
        .expect("a name on the last master");
    let moved_waiter = ParkedWaiter::park(&a, &b, &cluster, &parked_moved).await;
    let killed_waiter = ParkedWaiter::park(&a, &b, &cluster, &parked_killed).await;

    // 1. A reshard moves the first hot name's slot to another master.
    let from = masters[0];
    let to = masters[1];
    let resharded = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.reshard(from, to, 50))
            .await
            .expect("reshard")
    };
    assert_eq!(
        cluster.master_of(&lock_key(&moved)),
        to,
        "the reshard did not move {moved}:\n{resharded}"
    );
    assert!(
        grants_on_every_shard(&a, &names).await,
        "no grants within 30 s of the reshard"
    );
    moved_waiter.release_and_expect_woken(&a, &cluster).await;

    // 2. A master is killed; a replica takes over. Its replicas have the
    // parked lock first: what is asked here is that the waiter follows
    // the failover, not that Redis's asynchronous replication kept a write.
    let victim = masters[2];
    assert!(
        cluster
            .replicated_within(victim, Duration::from_secs(30))
            .await,
        "the replicas of {victim} did not catch up within 30 s"
    );
    cluster.kill(victim);
    let killed_at = Instant::now();
    let healed = cluster.healed_within(Duration::from_secs(30)).await;
    assert!(healed, "no replica took over within 30 s");
    assert!(
        grants_on_every_shard(&a, &names).await,
        "no grants within 30 s of the failover ({:?} after the kill)",
        killed_at.elapsed()
    );
    killed_waiter.release_and_expect_woken(&a, &cluster).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.expect("a client panicked");
    }
    let violations = violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    for (name, ledger) in names.iter().zip(ledgers.iter()) {
        assert!(
            !ledger.fences.lock().unwrap().is_empty(),
            "{name} was never granted"
        );
    }
}

/// How long a parked lock's lease lasts: longer than the phases between
/// parking and release take on a busy machine (a reshard, a failover and
/// the grants after it).
const PARKED_LEASE_MS: u64 = 240_000;

/// How long a parked waiter waits: less than the lease, so only a release
/// event can grant it in time.
const PARKED_WAIT_MS: u64 = 200_000;

/// Lets an instance take a waiter of [`PARKED_WAIT_MS`].
fn long_waits(settings: &mut lockd::config::Settings) {
    settings.limits.max_wait = Duration::from_millis(PARKED_WAIT_MS);
}

/// A lock `holder` holds for [`PARKED_LEASE_MS`], and a waiter on `waiter`
/// (an instance with [`long_waits`]) that waits for it for
/// [`PARKED_WAIT_MS`], subscribed to its release events.
struct ParkedWaiter {
    name: String,
    token: String,
    answer: tokio::task::JoinHandle<Result<crate::support::Reply, reqwest::Error>>,
    /// When the lock was taken: a release past [`PARKED_LEASE_MS`] finds
    /// the lease run out.
    parked_at: Instant,
}

impl ParkedWaiter {
    async fn park(
        holder: &TestApp,
        waiter: &TestApp,
        cluster: &crate::support::Cluster,
        name: &str,
    ) -> Self {
        // Right after a failover one answer may still be a 503.
        let mut held = holder.acquire_ttl(name, PARKED_LEASE_MS).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while held.status == 503 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            held = holder.acquire_ttl(name, PARKED_LEASE_MS).await;
        }
        held.expect_status(201);
        let parked_at = Instant::now();
        let answer = waiter.spawn_wait(name, 5_000, PARKED_WAIT_MS);
        let (key, channel) = (lock_key(name), format!("{}:released", lock_key(name)));
        assert!(
            eventually(Duration::from_secs(5), || async {
                cluster.shard_subscribers(cluster.master_of(&key), &channel) > 0
            })
            .await,
            "the waiter for {name} never subscribed"
        );
        Self {
            name: name.to_owned(),
            token: held.token(),
            answer,
            parked_at,
        }
    }

    /// Releases the lock on `holder`; the waiter must be granted within 15 s
    /// (the lease outlasts the wait, so a wake by the lease's end would
    /// come too late), a bound a busy machine meets.
    async fn release_and_expect_woken(self, holder: &TestApp, cluster: &crate::support::Cluster) {
        // Every answer, in order. A 503 during the failover may come from
        // a release that ran (lockd answers 503 when the masters changed
        // while its script ran: it cannot tell whether the write will
        // stay), so a 404 after a 503 is a release that went through; the
        // waiter's grant below is what proves the lock was freed.
        let answers = std::sync::Mutex::new(Vec::new());
        let released = eventually(Duration::from_secs(30), || async {
            let reply = holder.release(&self.name, &self.token).await;
            let mut answers = answers.lock().unwrap();
            let unsure_before = answers.iter().any(|(status, _)| *status == 503);
            answers.push((reply.status.as_u16(), reply.text.clone()));
            reply.status == 204 || (reply.status == 404 && unsure_before)
        })
        .await;
        assert!(
            released,
            "{}: the holder could not release ({:?} after it took the lock): {:?}",
            self.name,
            self.parked_at.elapsed(),
            answers.lock().unwrap()
        );
        let at = Instant::now();
        let status = tokio::time::timeout(Duration::from_secs(15), self.answer)
            .await
            .unwrap_or_else(|_| {
                let channel = format!("{}:released", lock_key(&self.name));
                let subscribed: Vec<(u16, u64)> = cluster
                    .urls()
                    .iter()
                    .filter_map(|u| u.rsplit(':').next()?.parse().ok())
                    .map(|port| (port, cluster.shard_subscribers(port, &channel)))
                    .collect();
                panic!(
                    "{}: the waiter was not woken within 15 s; subscribers per node {subscribed:?}; master {}; nodes:\n{}",
                    self.name,
                    cluster.master_of(&lock_key(&self.name)),
                    cluster.cli(cluster.master_of(&lock_key(&self.name)), &["CLUSTER", "NODES"])
                )
            })
            .expect("the waiter ran")
            .map_or(0, |reply| reply.status.as_u16());
        assert_eq!(status, 201, "{}: after {:?}", self.name, at.elapsed());
    }
}

/// A master frozen (SIGSTOP: its connections stay open, nothing answers)
/// until a replica takes over, one of lockd's two seeds: lockd leaves it
/// behind while it is still
/// frozen (grants on its slots within 30 s, a waiter parked across the
/// failover woken by the release), and once it thaws, no acquire gets a
/// second grant of a lock held on the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_is_left_behind_and_grants_nothing_when_it_thaws() {
    let cluster = Arc::new(crate::support::Cluster::start());
    // a's grants reach a replica before they are answered, so the locks it
    // holds survive the failover; b waits for no acknowledgement, so only
    // leaving the frozen master behind keeps it from granting there.
    // The master to freeze is one of the two seeds.
    let masters = cluster.masters();
    let frozen = masters[1];
    let seeds = move |s: &mut lockd::config::Settings| {
        s.store.redis_urls = [frozen, masters[0]]
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}").into())
            .collect();
        long_waits(s);
    };
    let a = Arc::new(
        TestApp::cluster_on(cluster.clone(), |s| {
            seeds(s);
            crate::support::with_acks(s, 1);
        })
        .await,
    );
    let b = a.sibling(seeds).await;
    let parked_name = (0..)
        .map(|i| format!("frozen-parked-{i}"))
        .find(|n| cluster.master_of(&lock_key(n)) == frozen)
        .expect("a name on the master to freeze");
    let held_name = (0..)
        .map(|i| format!("frozen-held-{i}"))
        .find(|n| cluster.master_of(&lock_key(n)) == frozen)
        .expect("a name on the master to freeze");
    // Pool connections and the subscription exist before the freeze. The
    // shared cluster may still be settling from an earlier test's failover
    // (a fresh instance's first readings of it can differ, and an answer
    // across such a change is a 503), as `ParkedWaiter::park` allows too.
    eventually_granted(&a, &held_name, 200).await;
    let parked = ParkedWaiter::park(&a, &b, &cluster, &parked_name).await;
    cluster.signal(frozen, "STOP");
    let healed = cluster.healed_within(Duration::from_secs(30)).await;
    assert!(healed, "no replica took over within 30 s");
    let names = one_name_per_master_of(&cluster, "frozen-probe-");
    assert!(
        grants_on_every_shard(&a, &names).await && grants_on_every_shard(&b, &names).await,
        "no grants within 30 s of the failover, the old master still frozen"
    );
    parked.release_and_expect_woken(&a, &cluster).await;
    // X holds a lock on the new master; acquires race the thaw.
    let held = eventually_granted(&a, &held_name, 60_000).await;
    let racers: Vec<_> = [a.clone(), Arc::new(b)]
        .into_iter()
        .map(|app| {
            let name = held_name.clone();
            tokio::spawn(async move {
                let mut granted = Vec::new();
                let until = Instant::now() + Duration::from_secs(3);
                while Instant::now() < until {
                    let reply = app.acquire_ttl(&name, 60_000).await;
                    if reply.status == 201 {
                        granted.push(reply.fence());
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                granted
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.signal(frozen, "CONT");
    for racer in racers {
        let granted = racer.await.expect("a racer ran");
        assert!(
            granted.is_empty(),
            "{held_name} held (fence {}) was granted again: fences {granted:?}",
            held.fence()
        );
    }
}

/// `name` granted to `app` within 10 s (503s right after a failover are
/// retried).
async fn eventually_granted(app: &TestApp, name: &str, ttl_ms: u64) -> crate::support::Reply {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = app.acquire_ttl(name, ttl_ms).await;
        if reply.status != 503 || Instant::now() > deadline {
            reply.expect_status(201);
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether, within 30 s, a fresh name next to each of `names` (same hash
/// tag prefix is not needed: any name on a live shard will do) is granted.
async fn grants_on_every_shard(app: &TestApp, names: &[String]) -> bool {
    eventually(Duration::from_secs(30), || async {
        for name in names {
            let probe = format!("{name}-probe-{}", random_token().get(..6).unwrap_or("x"));
            if app.acquire_ttl(&probe, 1_000).await.status != 201 {
                return false;
            }
        }
        true
    })
    .await
}

/// Lock names of this run, one served by each master of `cluster`.
fn one_name_per_master_of(cluster: &crate::support::Cluster, tag: &str) -> Vec<String> {
    let masters = cluster.masters();
    let mut names = vec![None; masters.len()];
    for i in 0.. {
        let name = format!("{tag}{i}");
        let master = cluster.master_of(&lock_key(&name));
        if let Some(at) = masters.iter().position(|&m| m == master) {
            names[at].get_or_insert(name);
        }
        if names.iter().all(Option::is_some) {
            break;
        }
    }
    names.into_iter().flatten().collect()
}

/// lockd seeded with one master keeps working when that master dies: new
/// connections go through the nodes it saw, and grants come back within
/// 10 s of a replica taking over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_only_seed_does_not_lose_the_cluster() {
    let cluster = Arc::new(crate::support::Cluster::start());
    let seed = cluster.masters()[0];
    let app = TestApp::cluster_on(cluster.clone(), |s| {
        s.store.redis_urls = vec![format!("redis://127.0.0.1:{seed}").into()];
    })
    .await;
    app.acquire_ttl("seed:warm", 5_000).await.expect_status(201);
    // The metrics name every master, by address.
    let masters_named = |text: &str, masters: &[u16]| {
        masters.iter().all(|m| {
            let node = format!("127.0.0.1:{m}");
            metric(text, "lockd_redis_master", &[("node", &node)]) == Some(1.0)
        })
    };
    let before = cluster.masters();
    assert!(
        eventually(Duration::from_secs(5), || async {
            masters_named(&app.metrics().await, &before)
        })
        .await,
        "{}",
        app.metrics().await
    );
    let waiter = app
        .sibling(|s| {
            s.store.redis_urls = vec![format!("redis://127.0.0.1:{seed}").into()];
            long_waits(s);
        })
        .await;
    let app = Arc::new(app);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Load through the failover, so connections fail and are made again.
    let load = {
        let (app, stop) = (app.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0_u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                i += 1;
                let _ = app.acquire_ttl(&format!("seed-load-{i}"), 1_000).await;
            }
        })
    };
    cluster.kill(seed);
    let healed = cluster.healed_within(Duration::from_secs(30)).await;
    assert!(healed, "no replica took over within 30 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    load.await.expect("the load ran");
    let names = one_name_per_master_of(&cluster, "seed-");
    assert!(
        grants_on_every_shard(&app, &names).await,
        "no grants within 30 s of the only seed's death"
    );
    // The promoted replica is named, the dead master no longer, and the
    // failover was counted.
    let after = cluster.masters();
    let dead = format!("127.0.0.1:{seed}");
    let named = eventually(Duration::from_secs(5), || async {
        let text = app.metrics().await;
        masters_named(&text, &after)
            && metric(&text, "lockd_redis_master", &[("node", &dead)]).is_none()
    })
    .await;
    let text = app.metrics().await;
    assert!(named, "masters {after:?}:\n{text}");
    assert_eq!(
        metric(&text, "lockd_redis_failovers_total", &[]),
        Some(1.0),
        "{text}"
    );
    // Release events still reach a waiter on an instance seeded with the
    // dead node alone, for names on every master, the promoted one too.
    for name in one_name_per_master_of(&cluster, "seed-wake-") {
        ParkedWaiter::park(&app, &waiter, &cluster, &name)
            .await
            .release_and_expect_woken(&app, &cluster)
            .await;
    }
}
