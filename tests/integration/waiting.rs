//! Server-side waiting (`wait_ms`, issue 3) and the field cases about it,
//! C08 to C11 (docs/field-cases.md: a grant made after the wait ended, a
//! lease counted from the grant, waiters woken by an expiry, waiters that
//! starve nobody), driven over HTTP against real redis-server processes
//! and the in-memory backend.
//!
//! Waiters are observed through `lockd_waiters` (a waiter is queued once the
//! gauge counts it), and retries through
//! `lockd_backend_duration_seconds_count{op="acquire"}` (one sample per
//! backend try) and, on Redis, `INFO commandstats`: that is how these tests
//! see that only a queue's head retries and that nobody polls.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::{
    Reply, TestApp, assert_lease_ms, backend_tests, lock_key, metric, ms_since, ms_until,
    random_token,
};
use futures::future::join_all;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::time::sleep;

backend_tests!(
    c08_a_wait_ending_as_the_holder_releases_leaks_no_lock,
    c08_a_client_that_hung_up_is_never_granted_the_lock,
    c09_the_lease_counts_from_the_grant_not_from_the_request,
    c10_a_waiter_wakes_when_the_holder_lease_runs_out,
    a_waiter_follows_an_extend_that_shortens_the_lease,
    sixty_four_waiters_are_served_one_at_a_time_with_growing_fences,
    a_waiter_that_hangs_up_leaves_the_queue_and_takes_no_lock,
    invalid_wait_ms_is_refused_before_waiting_and_writes_nothing,
    waiters_are_served_in_arrival_order_and_a_release_wakes_only_the_head,
    shutdown_ends_a_wait_with_503_shutting_down,
    metrics_show_waiters_timeouts_and_wait_times,
    a_timed_out_waiter_behind_the_head_is_told_when_the_lock_frees,
    a_holders_retry_queued_behind_a_waiter_renews_at_once,
);

backend_tests!(
    mod pool_of_16 = |s: &mut ::lockd::config::Settings| s.store.pool_size = ::std::num::NonZeroUsize::new(16).expect("not 0");
    c11_waiters_do_not_starve_other_requests,
);

backend_tests!(
    mod two_waiters_at_most = |s: &mut ::lockd::config::Settings| s.limits.max_waiters = ::std::num::NonZeroUsize::new(2).expect("not 0");
    a_full_wait_queue_answers_503_and_everything_else_still_works,
    a_waiting_request_for_a_free_lock_is_granted_when_the_queue_is_full,
);

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// An acquire body asking for `ttl_ms` and waiting up to `wait_ms`.
fn wait_body(ttl_ms: u64, wait_ms: u64) -> Value {
    json!({ "ttl_ms": ttl_ms, "wait_ms": wait_ms })
}

/// `POST /locks/{name}` with `ttl_ms` and `wait_ms` in the body.
async fn acquire_waiting(app: &TestApp, name: &str, ttl_ms: u64, wait_ms: u64) -> Reply {
    app.acquire(name, Some(wait_body(ttl_ms, wait_ms))).await
}

/// `lockd_waiters` now.
async fn waiters(app: &TestApp) -> u64 {
    metric(&app.metrics().await, "lockd_waiters", &[]).expect("lockd_waiters gauge") as u64
}

/// Waits until `lockd_waiters` is `n` (panics after 5 s).
async fn until_waiters(app: &TestApp, n: u64) {
    // Bounded well above what an idle machine needs: a busy one may take
    // seconds to queue many waiters.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = waiters(app).await;
        if now == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "lockd_waiters stayed {now}, expected {n}"
        );
        sleep(Duration::from_millis(5)).await;
    }
}

/// How many acquire tries reached the backend so far.
async fn acquire_tries(app: &TestApp) -> u64 {
    let text = app.metrics().await;
    // Redlock's every try calls each node.
    metric(
        &text,
        "lockd_backend_duration_seconds_count",
        &[("op", "acquire")],
    )
    .unwrap_or(0.0) as u64
        / app.node_count() as u64
}

/// `POST /locks/{name}` with a JSON body through `client` (one that hangs
/// up early); `Err` when it got no answer.
async fn post_via(
    app: &TestApp,
    client: &reqwest::Client,
    name: &str,
    body: &Value,
) -> Result<Reply, reqwest::Error> {
    let body = serde_json::to_vec(body).unwrap();
    let path = format!("/locks/{name}");
    app.try_send_via(
        client,
        Method::POST,
        &path,
        &[("content-type", "application/json")],
        Some(body),
    )
    .await
}

/// Waits until `name` is free in the store; false when it is still held
/// after `within`.
async fn freed_within(app: &TestApp, name: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if app.holder(name).await.is_none() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        sleep(Duration::from_millis(10)).await;
    }
}

/// Records grants of one lock and fails when two clients hold it at once.
#[derive(Default)]
struct Exclusive {
    inside: AtomicUsize,
    /// (client, fence) in grant order.
    grants: Mutex<Vec<(usize, u64)>>,
}

impl Exclusive {
    fn enter(&self, who: usize, fence: u64) {
        let before = self.inside.fetch_add(1, Ordering::SeqCst);
        assert_eq!(
            before, 0,
            "client {who} was granted the lock while another client held it"
        );
        self.grants.lock().unwrap().push((who, fence));
    }

    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn grants(&self) -> Vec<(usize, u64)> {
        self.grants.lock().unwrap().clone()
    }
}

/// Client `who` waits for `name`; when granted, checks that the store agrees,
/// holds the lock for `hold`, then releases it. Returns the acquire answer.
async fn take_hold_release(
    app: &TestApp,
    name: &str,
    who: usize,
    wait_ms: u64,
    hold: Duration,
    seen: &Exclusive,
) -> Reply {
    let reply = acquire_waiting(app, name, 10_000, wait_ms).await;
    if reply.status.as_u16() == 201 {
        let token = reply.token();
        seen.enter(who, reply.fence());
        assert_eq!(
            app.holder_token(name).await,
            Some(token.clone()),
            "client {who} got 201 but the store does not hold its token"
        );
        sleep(hold).await;
        seen.leave();
        app.release(name, &token).await.expect_status(204);
    }
    reply
}

/// Asserts that fences grow strictly in grant order.
#[track_caller]
fn assert_fences_grow(grants: &[(usize, u64)]) {
    for pair in grants.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "fences did not grow in grant order: {grants:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// C08 timeout-race: a lock granted after the wait ended must not leak
// ---------------------------------------------------------------------------

const C08_ROUNDS: u64 = 50;
/// Rounds run at once, each on its own lock name, to bound the run time.
const C08_AT_ONCE: u64 = 25;

/// When A releases in round `round`: spread over 480 to 520 ms.
fn c08_release_after(round: u64) -> Duration {
    Duration::from_millis(480 + 40 * round / (C08_ROUNDS - 1))
}

/// A holds `k` with ttl 10 s; B asks for `k` with wait 500 ms while A
/// releases at 480 to 520 ms; 50 rounds. A 201 to B must mean B holds `k`;
/// any other answer must leave `k` free (A's token is gone, and B never saw
/// one). At the end no lock key is left.
async fn c08_a_wait_ending_as_the_holder_releases_leaks_no_lock(app: &TestApp) {
    let (mut granted, mut timed_out) = (0, 0);
    for batch in 0..C08_ROUNDS / C08_AT_ONCE {
        let rounds = (0..C08_AT_ONCE).map(|i| c08_round(app, batch * C08_AT_ONCE + i));
        for got_it in join_all(rounds).await {
            if got_it {
                granted += 1;
            } else {
                timed_out += 1;
            }
        }
    }
    eprintln!("c08: B granted {granted}x, timed out {timed_out}x");
    assert_eq!(app.lock_key_count().await, 0, "orphan lock keys are left");
}

/// One round of C08; true when B was granted.
async fn c08_round(app: &TestApp, round: u64) -> bool {
    let name = format!("c08-{round}");
    let a = app.acquire_ttl(&name, 10_000).await;
    a.expect_status(201);
    let tok_a = a.token();
    let (b, released) = tokio::join!(acquire_waiting(app, &name, 10_000, 500), async {
        sleep(c08_release_after(round)).await;
        app.release(&name, &tok_a).await
    });
    released.expect_status(204);
    match b.status.as_u16() {
        201 => {
            let tok_b = b.token();
            assert_eq!(
                app.holder_token(&name).await,
                Some(tok_b.clone()),
                "round {round}: B got 201 but does not hold the lock"
            );
            app.release(&name, &tok_b).await.expect_status(204);
            true
        }
        _ => {
            b.expect_problem(409, "lock-held");
            assert_eq!(
                app.holder(&name).await,
                None,
                "round {round}: B was answered 409, yet the lock is held by a token no client received"
            );
            false
        }
    }
}

/// The second form of C08: B's HTTP client hangs up at 300 ms, then A
/// releases at 480 to 520 ms, within B's 500 ms wait. The server must have
/// dropped B's wait: the lock ends up free, not held for a caller who is
/// gone (B asked for a 10 s lease, so a leak would show).
async fn c08_a_client_that_hung_up_is_never_granted_the_lock(app: &TestApp) {
    let impatient = TestApp::client_with_timeout(Duration::from_millis(300));
    for batch in 0..C08_ROUNDS / C08_AT_ONCE {
        let rounds =
            (0..C08_AT_ONCE).map(|i| c08_hang_up_round(app, &impatient, batch * C08_AT_ONCE + i));
        join_all(rounds).await;
    }
    until_waiters(app, 0).await;
    assert_eq!(app.lock_key_count().await, 0, "orphan lock keys are left");
}

async fn c08_hang_up_round(app: &TestApp, impatient: &reqwest::Client, round: u64) {
    let name = format!("c08-gone-{round}");
    let a = app.acquire_ttl(&name, 10_000).await;
    a.expect_status(201);
    let tok_a = a.token();
    let body = wait_body(10_000, 500);
    let (b, released) = tokio::join!(post_via(app, impatient, &name, &body), async {
        sleep(c08_release_after(round)).await;
        app.release(&name, &tok_a).await
    });
    match b {
        Err(e) if e.is_timeout() => {}
        Err(e) => panic!("round {round}: B's request failed other than by hanging up: {e}"),
        Ok(reply) => panic!(
            "round {round}: B got an answer before A released: {} {}",
            reply.status, reply.text
        ),
    }
    released.expect_status(204);
    // A ghost grant would follow A's release within a few ms; give it time
    // to show, then the lock must be free.
    sleep(Duration::from_millis(100)).await;
    assert!(
        freed_within(app, &name, Duration::from_millis(300)).await,
        "round {round}: the lock was granted to B after B's client hung up, and is held by {:?}",
        app.holder(&name).await
    );
}

/// The grant itself races the hang-up: Redis is frozen (SIGSTOP) while B's
/// first try is in flight, B's client hangs up at 300 ms, Redis resumes at
/// 450 ms (within lockd's 1 s Redis timeout) and grants the free lock to
/// the caller who is gone. lockd must compare-and-delete that lock: the
/// fence shows the grant happened, and a release reached Redis that no
/// client sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_a_grant_that_completes_after_the_client_hung_up_is_compare_and_deleted() {
    let app = TestApp::redis().await;
    let redis = app.redis_server();
    let name = "c08-frozen";
    let impatient = TestApp::client_with_timeout(Duration::from_millis(300));
    let body = wait_body(10_000, 5_000);

    redis.sigstop();
    let (b, ()) = tokio::join!(post_via(&app, &impatient, name, &body), async {
        sleep(Duration::from_millis(450)).await;
        redis.sigcont();
    });
    let err = b.expect_err("B's client hangs up while Redis is frozen");
    assert!(err.is_timeout(), "B failed other than by hanging up: {err}");

    // The grant lands once Redis runs the queued script.
    let fence_key = format!("{}:fence", lock_key(name));
    let deadline = Instant::now() + Duration::from_secs(2);
    while redis
        .cmd::<Option<u64>>(::redis::cmd("GET").arg(&fence_key))
        .await
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "Redis never granted the lock: not the race"
        );
        sleep(Duration::from_millis(10)).await;
    }
    assert!(
        freed_within(&app, name, Duration::from_secs(1)).await,
        "the lock granted after B hung up was left set: {:?}",
        app.holder(name).await
    );
    // Redis deleted the key before lockd read the release's answer and
    // counted it: wait for that count.
    let release_count = |text: &str| {
        metric(
            text,
            "lockd_backend_duration_seconds_count",
            &[("op", "release")],
        )
    };
    crate::support::eventually(Duration::from_secs(5), || async {
        release_count(&app.metrics().await).is_some()
    })
    .await;
    let text = app.metrics().await;
    let backend_acquires = metric(
        &text,
        "lockd_backend_duration_seconds_count",
        &[("op", "acquire")],
    );
    assert_eq!(backend_acquires, Some(1.0), "more than one grant");
    assert_eq!(
        release_count(&text),
        Some(1.0),
        "lockd did not release the orphan grant itself"
    );
    assert_eq!(app.lock_key_count().await, 0);
    until_waiters(&app, 0).await;
}

/// The grant races a Redis timeout: Redis holds back writes for 800 ms
/// (`CLIENT PAUSE ... WRITE`; reads and PING still answer), so B's acquire
/// script waits unanswered and lockd answers 503 after its 300 ms Redis
/// timeout. Redis then runs the script, setting the lock for B's token,
/// which B never received. By C08 that lock must not stay: lockd has to
/// compare-and-delete it once Redis answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c08_a_503_after_a_redis_timeout_leaves_no_lock_behind() {
    let app = TestApp::redis_with(|s| s.store.redis_timeout = Duration::from_millis(300)).await;
    let redis = app.redis_server();
    let name = "c08-timeout";
    // Load the scripts and open a pooled connection first, so that B's
    // script is the only thing held back.
    let warm = app.acquire_ttl("warm-up", 1000).await;
    warm.expect_status(201);
    app.release("warm-up", &warm.token())
        .await
        .expect_status(204);
    let _: () = redis
        .cmd(::redis::cmd("CLIENT").arg("PAUSE").arg(800).arg("WRITE"))
        .await;
    let b = acquire_waiting(&app, name, 10_000, 2000).await;
    b.expect_problem(503, "backend-unavailable");

    // Redis runs B's script once the pause ends (at 800 ms), unless lockd
    // closed the connection it was queued on first; either way, once Redis
    // answers again, no lock may stay under B's token.
    sleep(Duration::from_millis(900)).await;
    assert!(
        freed_within(&app, name, Duration::from_secs(2)).await,
        "B was answered 503, yet the lock is held by a token no client received: {:?}",
        app.holder(name).await
    );
    sleep(Duration::from_millis(500)).await;
    assert_eq!(app.holder(name).await, None, "the lock came back");
}

// ---------------------------------------------------------------------------
// C09 timeout-race: TTL counts from the grant, not from the request
// ---------------------------------------------------------------------------

/// A holds `k` and releases it at 1200 ms; B asked at t = 0 for ttl 1000 and
/// wait 3000. B's lease must start at its grant: `ttl_ms` positive and no
/// more than the store's remaining lease plus a few ms, `expires_at` about
/// 1 s ahead, and an immediate extend succeeds.
async fn c09_the_lease_counts_from_the_grant_not_from_the_request(app: &TestApp) {
    let name = "c09";
    let a = app.acquire_ttl(name, 10_000).await;
    a.expect_status(201);
    let tok_a = a.token();
    let asked = Instant::now();
    let (b, (released, release_sent)) =
        tokio::join!(acquire_waiting(app, name, 1000, 3000), async {
            sleep(Duration::from_millis(1200)).await;
            let sent = Instant::now();
            (app.release(name, &tok_a).await, sent)
        });
    released.expect_status(204);
    b.expect_status(201);
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_millis(1150),
        "B was granted after {waited:?}, before A released"
    );

    let to_expiry = ms_until(&b.str("expires_at"));
    let (holder, pttl) = app.holder(name).await.expect("B holds the lock");
    assert_eq!(holder, b.token());
    let ttl_ms = i64::try_from(b.u64("ttl_ms")).unwrap();
    assert!(ttl_ms > 0, "ttl_ms {ttl_ms}");
    assert!(
        ttl_ms <= pttl + 30,
        "ttl_ms {ttl_ms} but the store's lease has {pttl} ms left"
    );
    // B was granted after A's release was sent, 1200 ms after B asked: a
    // lease counted from B's request would be over by now. What is left
    // is short of 1000 ms by no more than the time since that release.
    let since_release = ms_since(release_sent);
    assert!(
        to_expiry <= 1000 && to_expiry + since_release + 30 >= 1000,
        "expires_at is {to_expiry} ms away, {since_release} ms after A's release was sent: the lease did not count from the grant"
    );
    assert!(
        pttl + since_release + 2 >= 1000,
        "the store's lease has only {pttl} ms left, {since_release} ms after A's release was sent"
    );

    let extended = app.extend_ttl(name, &b.token(), 1000).await;
    extended.expect_status(200);
    assert_eq!(extended.fence(), b.fence());
    app.release(name, &b.token()).await.expect_status(204);
    assert_eq!(app.lock_key_count().await, 0);
}

// ---------------------------------------------------------------------------
// C10 state-desync: waiters wake on expiry, not only on release
// ---------------------------------------------------------------------------

/// A takes `k` with ttl 1000 and never releases; B, sent right after, waits
/// on the same instance and must be granted once A's lease ends, from one
/// try at the start and one when A's lease ends (no polling). A's late
/// release is 409.
async fn c10_a_waiter_wakes_when_the_holder_lease_runs_out(app: &TestApp) {
    let name = "c10";
    // Counted before A's grant, so that B is sent right after it (a busy
    // machine's scrape could outlast a short lease).
    let tries_before = acquire_tries(app).await + 1;
    // A's lease begins after this, however late its answer comes.
    let a_sent = Instant::now();
    let a = app.acquire_ttl(name, 1000).await;
    a.expect_status(201);
    // B's wait is long (a busy machine may take its time); that it woke
    // at A's expiry, not by polling, the count of its tries tells.
    let b = app
        .acquire(name, Some(json!({ "ttl_ms": 10_000, "wait_ms": 30_000 })))
        .await;
    let after = a_sent.elapsed();
    b.expect_status(201);
    assert!(
        after >= Duration::from_millis(998),
        "B was answered {after:?} after A's request was sent, before A's lease ended"
    );
    let tries = acquire_tries(app).await - tries_before;
    assert!(
        (2..=3).contains(&tries),
        "B's wait made {tries} acquire tries; expected one at the start and one at A's expiry"
    );
    assert!(b.fence() > a.fence());

    app.release(name, &a.token())
        .await
        .expect_problem(409, "not-lock-owner");
    assert_eq!(app.holder_token(name).await, Some(b.token()));
    app.release(name, &b.token()).await.expect_status(204);
}

/// A holds `k` for 30 s, B waits; A then shortens its lease to 500 ms with
/// an extend. B must be granted when that shorter lease ends, not sleep on
/// to the old one (the extend publishes, and the head looks again).
async fn a_waiter_follows_an_extend_that_shortens_the_lease(app: &TestApp) {
    let name = "shrink";
    let a = app.acquire_ttl(name, 30_000).await;
    a.expect_status(201);
    let asked = Instant::now();
    let (b, shortened) = tokio::join!(acquire_waiting(app, name, 5000, 8000), async {
        sleep(Duration::from_millis(300)).await;
        app.extend_ttl(name, &a.token(), 500).await
    });
    shortened.expect_status(200);
    b.expect_status(201);
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_millis(750) && waited < Duration::from_millis(2500),
        "B was granted after {waited:?}; A's shortened lease ended at about 800 ms"
    );
    app.release(name, &b.token()).await.expect_status(204);
}

/// A lock freed behind lockd's back (deleted straight in Redis: no event)
/// is still taken by the waiter when its wait ends, not refused as held.
#[tokio::test]
async fn a_waiter_looks_once_more_when_its_wait_ends() {
    let app = TestApp::redis().await;
    let name = "foreign-delete";
    let a = app.acquire_ttl(name, 30_000).await;
    a.expect_status(201);
    let (b, ()) = tokio::join!(acquire_waiting(&app, name, 5000, 1000), async {
        sleep(Duration::from_millis(300)).await;
        app.redis_server()
            .cmd::<()>(::redis::cmd("DEL").arg(lock_key(name)))
            .await;
    });
    b.expect_status(201);
    assert_eq!(app.holder_token(name).await, Some(b.token()));
}

/// A wait on a lock key a foreign client set with no TTL runs out with a
/// 409 that says the key has no TTL, suggests a retry (`Retry-After`),
/// and claims no lease end.
#[tokio::test]
async fn a_wait_on_a_key_with_no_ttl_runs_out_without_a_lease_end() {
    let app = TestApp::redis().await;
    let name = "no-ttl-wait";
    app.set_lock_key_without_ttl(name).await;
    for wait_ms in [300, 1500] {
        let r = acquire_waiting(&app, name, 5000, wait_ms).await;
        let problem = r.expect_problem(409, "lock-held");
        let detail = problem["detail"].as_str().expect("detail");
        assert!(
            detail.contains("within wait_ms") && detail.contains("no TTL"),
            "wait {wait_ms}: {detail}"
        );
        assert!(
            !detail.contains("at most"),
            "wait {wait_ms}: a lease end is claimed: {detail}"
        );
        assert_eq!(r.header("retry-after").as_deref(), Some("1"));
    }
    assert_eq!(waiters(&app).await, 0);
}

/// A waiter on a key with no TTL looks again each second (the suggested
/// retry), so the key's delete (no event) grants it long before its wait
/// would end.
#[tokio::test]
async fn a_waiter_on_a_key_with_no_ttl_looks_again_each_second() {
    let app = TestApp::redis().await;
    let name = "no-ttl-relook";
    app.set_lock_key_without_ttl(name).await;
    let asked = Instant::now();
    let (b, ()) = tokio::join!(acquire_waiting(&app, name, 5000, 30_000), async {
        until_waiters(&app, 1).await;
        app.redis_server()
            .cmd::<()>(::redis::cmd("DEL").arg(lock_key(name)))
            .await;
    });
    b.expect_status(201);
    let waited = asked.elapsed();
    assert!(
        waited < Duration::from_secs(20),
        "granted after {waited:?}: not at a re-look, only when the 30 s wait ended"
    );
    assert_eq!(app.holder_token(name).await, Some(b.token()));
}

// ---------------------------------------------------------------------------
// C11 contention: waiters do not starve everyone else
// ---------------------------------------------------------------------------

/// Pool size 16. A holds `hot` for 3 s while 64 clients wait on it (wait
/// 5000). Meanwhile about 10 requests a second go to other names and to
/// `/metrics`: none may fail or be slow. Waiters make no tries while they
/// sleep, and after A's release each release hands `hot` to exactly one
/// waiter, so all 64 are served, one at a time, with growing fences.
async fn c11_waiters_do_not_starve_other_requests(app: &TestApp) {
    const WAITERS: usize = 64;
    /// Rounds of other requests answered while the waiters wait, before
    /// the holder lets go: they are not starved.
    const ROUNDS: u32 = 12;
    let name = "hot";
    let a = app.acquire_ttl(name, 60_000).await;
    a.expect_status(201);
    let tok_a = a.token();
    let tries_before = acquire_tries(app).await;
    let seen = Exclusive::default();
    let load_acquires = AtomicUsize::new(0);
    let max_seen_waiters = AtomicUsize::new(0);
    let rounds = AtomicUsize::new(0);
    let released = std::sync::atomic::AtomicBool::new(false);

    let waiters_side = join_all(
        (0..WAITERS)
            .map(|who| take_hold_release(app, name, who, 60_000, Duration::from_millis(2), &seen)),
    );
    let holder_side = async {
        // Every waiter queued, and the other requests served meanwhile.
        until_waiters(app, WAITERS as u64).await;
        let queued_at = rounds.load(Ordering::SeqCst);
        let served = crate::support::eventually(Duration::from_secs(50), || async {
            rounds.load(Ordering::SeqCst) >= queued_at + ROUNDS as usize
        })
        .await;
        released.store(true, Ordering::SeqCst);
        app.release(name, &tok_a).await.expect_status(204);
        served
    };
    let load_side = async {
        let mut failed = Vec::new();
        let mut n = 0u32;
        while !released.load(Ordering::SeqCst) {
            let other = format!("cold-{n}");
            let replies = match n % 3 {
                0 => {
                    load_acquires.fetch_add(1, Ordering::SeqCst);
                    let got = app.acquire_ttl(&other, 5000).await;
                    let released = app.release(&other, &got.token()).await;
                    vec![got, released]
                }
                1 => {
                    let reply = app.get("/metrics").await;
                    let queued = metric(&reply.text, "lockd_waiters", &[]).unwrap() as usize;
                    max_seen_waiters.fetch_max(queued, Ordering::SeqCst);
                    vec![reply]
                }
                _ => vec![app.inspect(&other).await],
            };
            let statuses: Vec<u16> = replies.iter().map(|r| r.status.as_u16()).collect();
            if statuses.iter().any(|s| *s >= 500) {
                failed.push((n, statuses));
            }
            n += 1;
            rounds.store(n as usize, Ordering::SeqCst);
            sleep(Duration::from_millis(20)).await;
        }
        failed
    };
    let (replies, served, failed) = tokio::join!(waiters_side, holder_side, load_side);

    assert!(
        served,
        "fewer than {ROUNDS} rounds of requests to other names were answered while {WAITERS} waited"
    );
    assert!(
        failed.is_empty(),
        "requests to other names and /metrics failed while {WAITERS} waited: {failed:?}"
    );
    assert_eq!(
        max_seen_waiters.load(Ordering::SeqCst),
        WAITERS,
        "/metrics never showed all waiters queued"
    );
    for (who, reply) in replies.iter().enumerate() {
        assert_eq!(reply.status.as_u16(), 201, "waiter {who}: {}", reply.text);
    }
    let grants = seen.grants();
    assert_eq!(grants.len(), WAITERS);
    assert_fences_grow(&grants);
    // The first waiter's try, then per handoff the woken head's try and the
    // next head's first look; polling or a herd would make far more.
    let tries = acquire_tries(app).await - tries_before;
    let by_load = load_acquires.load(Ordering::SeqCst) as u64;
    let mut budget = by_load + 2 * WAITERS as u64 + 4;
    if app.is_redlock() {
        // Each node sends its own release event: the copies that arrive
        // after a handoff may wake the next head for one more try each.
        budget += 2 * WAITERS as u64;
    }
    assert!(
        tries <= budget,
        "{tries} acquire tries ({by_load} from other names) for {WAITERS} handoffs; expected at most {budget}"
    );
    assert_eq!(app.lock_key_count().await, 0);
}

// ---------------------------------------------------------------------------
// Many waiters on one lock
// ---------------------------------------------------------------------------

/// 64 clients ask for one lock at once, with a wait; each holds it briefly
/// and releases. Every one is served, never two at a time, and the fences
/// grow in grant order.
async fn sixty_four_waiters_are_served_one_at_a_time_with_growing_fences(app: &TestApp) {
    const CLIENTS: usize = 64;
    let name = "busy";
    let seen = Exclusive::default();
    let replies = join_all(
        (0..CLIENTS)
            .map(|who| take_hold_release(app, name, who, 20_000, Duration::from_millis(3), &seen)),
    )
    .await;
    for (who, reply) in replies.iter().enumerate() {
        assert_eq!(reply.status.as_u16(), 201, "client {who}: {}", reply.text);
    }
    let grants = seen.grants();
    assert_eq!(grants.len(), CLIENTS);
    assert_fences_grow(&grants);
    assert_eq!(waiters(app).await, 0);
    assert_eq!(app.lock_key_count().await, 0);
}

// ---------------------------------------------------------------------------
// A waiter that goes away
// ---------------------------------------------------------------------------

/// A holds `k`; W1 (whose client hangs up at 300 ms) and then W2 wait. Once
/// W1 has hung up, `lockd_waiters` drops to 1, and A's release hands `k` to
/// W2, not to W1's ghost. Nothing is left behind.
async fn a_waiter_that_hangs_up_leaves_the_queue_and_takes_no_lock(app: &TestApp) {
    let name = "k";
    let a = app.acquire_ttl(name, 60_000).await;
    a.expect_status(201);
    // W1's client gives up after 3 s: time for a busy machine to queue W2
    // behind it first. Each step waits for the event it needs.
    let impatient = TestApp::client_with_timeout(Duration::from_secs(3));
    let body = wait_body(10_000, 30_000);
    let (w1, w2, ()) = tokio::join!(
        post_via(app, &impatient, name, &body),
        async {
            until_waiters(app, 1).await;
            acquire_waiting(app, name, 10_000, 30_000).await
        },
        async {
            until_waiters(app, 2).await;
            assert!(
                crate::support::eventually(Duration::from_secs(20), || async {
                    waiters(app).await == 1
                })
                .await,
                "W1 hung up but is still counted as waiting"
            );
            app.release(name, &a.token()).await.expect_status(204);
        },
    );
    let err = w1.expect_err("W1's client hangs up");
    assert!(
        err.is_timeout(),
        "W1 failed other than by hanging up: {err}"
    );
    w2.expect_status(201);
    assert_eq!(app.holder_token(name).await, Some(w2.token()));
    app.release(name, &w2.token()).await.expect_status(204);
    assert_eq!(waiters(app).await, 0);
    assert_eq!(app.lock_key_count().await, 0);
}

// ---------------------------------------------------------------------------
// Input
// ---------------------------------------------------------------------------

/// wait_ms over `max_wait_ms` (60000), negative, fractional, a string, a
/// boolean, too large for 64 bits, or given both in the query and the body:
/// 400 at once, even while the lock is held (nobody waits), and nothing is
/// written. The boundaries 0 and 60000 are accepted.
async fn invalid_wait_ms_is_refused_before_waiting_and_writes_nothing(app: &TestApp) {
    let bodies = [
        json!({ "wait_ms": 60_001 }),
        json!({ "wait_ms": -1 }),
        json!({ "wait_ms": 1.5 }),
        json!({ "wait_ms": "1500" }),
        json!({ "wait_ms": true }),
        json!({ "wait_ms": [1500] }),
    ];
    let queries = [
        "wait_ms=60001",
        "wait_ms=-1",
        "wait_ms=1.5",
        "wait_ms=",
        "wait_ms=abc",
        "wait_ms=1e3",
        "wait_ms=%2B5",
        "wait_ms=18446744073709551616",
    ];
    for held in [false, true] {
        let name = "refused";
        let holder = if held {
            let a = app.acquire_ttl(name, 10_000).await;
            a.expect_status(201);
            Some(a.token())
        } else {
            None
        };
        let keys_before = app.lock_key_count().await;
        let tries_before = acquire_tries(app).await;
        let mut refusals = Vec::new();
        for body in &bodies {
            let what = format!("body {body}");
            refusals.push((what, app.acquire(name, Some(body.clone())).await));
        }
        for query in queries {
            let what = format!("query {query}");
            let path = format!("/locks/{name}?{query}");
            refusals.push((what, app.send(Method::POST, &path, &[], None).await));
        }
        let both = app
            .send_json(
                Method::POST,
                &format!("/locks/{name}?wait_ms=100"),
                &[],
                Some(json!({ "wait_ms": 100 })),
            )
            .await;
        refusals.push(("query and body".to_owned(), both));
        for (what, reply) in &refusals {
            assert_eq!(reply.status.as_u16(), 400, "{what}: {}", reply.text);
            reply.expect_problem(400, "invalid-request");
        }
        assert_eq!(
            acquire_tries(app).await,
            tries_before,
            "a refused request reached the store"
        );
        assert_eq!(app.lock_key_count().await, keys_before);
        assert_eq!(app.holder_token(name).await, holder);
        assert_eq!(waiters(app).await, 0);
        if let Some(token) = holder {
            // 0 is fail-fast, in the body and in the query.
            for (path, body) in [
                (format!("/locks/{name}"), Some(json!({ "wait_ms": 0 }))),
                (format!("/locks/{name}?wait_ms=0"), None),
            ] {
                let sent = Instant::now();
                let reply = app.send_json(Method::POST, &path, &[], body).await;
                reply.expect_problem(409, "lock-held");
                assert!(sent.elapsed() < Duration::from_millis(500));
            }
            app.release(name, &token).await.expect_status(204);
        }
    }
    // The cap itself is accepted (the lock is free, so nobody waits).
    let at_cap = acquire_waiting(app, "refused", 1000, 60_000).await;
    at_cap.expect_status(201);
    app.release("refused", &at_cap.token())
        .await
        .expect_status(204);
    let in_query = app
        .send(Method::POST, "/locks/refused?wait_ms=60000", &[], None)
        .await;
    in_query.expect_status(201);
    app.release("refused", &in_query.token())
        .await
        .expect_status(204);
}

// ---------------------------------------------------------------------------
// Queue order and wake-ups
// ---------------------------------------------------------------------------

/// A holds `k`; eight clients queue one after the other. While they wait,
/// no acquire try is made (no polling). Then they are served in arrival
/// order, and each handoff costs one try (the woken head's), not one per
/// waiter: the waiter behind one that was granted waits for that lease's
/// release rather than trying a lock it knows is held.
async fn waiters_are_served_in_arrival_order_and_a_release_wakes_only_the_head(app: &TestApp) {
    const CLIENTS: usize = 8;
    let name = "fifo";
    let a = app.acquire_ttl(name, 10_000).await;
    a.expect_status(201);
    let seen = Exclusive::default();
    let clients = join_all((0..CLIENTS).map(|who| {
        let seen = &seen;
        async move {
            until_waiters(app, who as u64).await;
            take_hold_release(app, name, who, 10_000, Duration::from_millis(5), seen).await
        }
    }));
    let holder_side = async {
        until_waiters(app, CLIENTS as u64).await;
        let before = acquire_tries(app).await;
        sleep(Duration::from_millis(300)).await;
        let idle = acquire_tries(app).await;
        assert_eq!(
            idle, before,
            "waiters made acquire tries while the lock stayed held"
        );
        app.release(name, &a.token()).await.expect_status(204);
        idle
    };
    let (replies, tries_at_release) = tokio::join!(clients, holder_side);
    for (who, reply) in replies.iter().enumerate() {
        assert_eq!(reply.status.as_u16(), 201, "client {who}: {}", reply.text);
    }
    let grants = seen.grants();
    let order: Vec<usize> = grants.iter().map(|(who, _)| *who).collect();
    assert_eq!(
        order,
        (0..CLIENTS).collect::<Vec<_>>(),
        "not first come, first served"
    );
    assert_fences_grow(&grants);
    let tries = acquire_tries(app).await - tries_at_release;
    let mut budget = CLIENTS as u64;
    if app.is_redlock() {
        // Each node sends its own release event: the copies that arrive
        // after a handoff may wake the next head for one more try each.
        budget += 2 * CLIENTS as u64;
    }
    assert!(
        tries <= budget,
        "{tries} acquire tries for {CLIENTS} handoffs: waiters behind the head retried"
    );
}

/// A holds `k` with metadata; W waits for it on the same instance, the
/// only one listening to the lock's changes. A's release makes W's try in
/// the same script: the handoff costs Redis one script (W's own try never
/// runs), W gets a larger fence, and `GET` and the history tell W's lease
/// with its owner and metadata, and A's as released. (Twice: the first
/// round loads the script into Redis, which its count would include.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_the_waiter_in_one_script() {
    let app = TestApp::redis().await;
    let redis = app.redis_server();
    for round in 0..2 {
        let name = format!("handoff-{round}");
        let a = app
            .acquire(&name, Some(json!({"ttl_ms": 10_000, "owner": "a"})))
            .await;
        a.expect_status(201);
        let body = json!({"ttl_ms": 10_000, "wait_ms": 10_000, "owner": "w", "meta": {"pid": 7}});
        let waiter = app.acquire(&name, Some(body));
        let holder_side = async {
            until_waiters(&app, 1).await;
            // W found it held, its instance subscribed to the lock's
            // changes, and W looked once (an inspect) before it sleeps,
            // in the same step as that look's end.
            until_looked(&app, round + 1).await;
            sleep(Duration::from_millis(20)).await;
            redis.reset_stats().await;
            let tries = acquire_tries(&app).await;
            app.release(&name, &a.token()).await.expect_status(204);
            (redis.script_calls().await, tries)
        };
        let (w, (scripts, tries)) = tokio::join!(waiter, holder_side);
        w.expect_status(201);
        if round == 1 {
            assert_eq!(scripts, 1, "a handoff should take one script");
        }
        assert_eq!(acquire_tries(&app).await, tries, "W tried for itself");
        assert!(
            w.fence() > a.fence(),
            "fence {} after {}",
            w.fence(),
            a.fence()
        );
        let history = app.get(&format!("/locks/{name}/history")).await;
        history.expect_status(200);
        let entries = history.json()["entries"].clone();
        assert_eq!(entries[0]["fence"], w.fence(), "{entries}");
        assert_eq!(entries[0]["owner"], "w");
        assert_eq!(entries[0]["meta"], json!({"pid": 7}));
        assert_eq!(entries[0]["ended"], Value::Null);
        assert_eq!(entries[1]["fence"], a.fence(), "{entries}");
        assert_eq!(entries[1]["ended"], "released");
        let held = app.get(&format!("/locks/{name}")).await;
        held.expect_status(200);
        assert_eq!(held.json()["fence"], w.fence());
        app.release(&name, &w.token()).await.expect_status(204);
    }
    assert_eq!(app.lock_key_count().await, 0);
}

/// Two instances on one Redis, a waiter on each. A release sent to the
/// first does not hand the lock to its own waiter, since the second
/// listens to the lock's changes too (it may have waiters of its own,
/// which must not wait behind the first's for ever): the lock is
/// released, and each instance's head tries once at the release, as at
/// any release. One of them gets it, the other after its release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_nothing_over_while_another_instance_listens() {
    let one = TestApp::redis().await;
    let two = one.sibling(|_| {}).await;
    let redis = one.redis_server();
    let name = "fair";
    let a = one.acquire_ttl(name, 10_000).await;
    a.expect_status(201);
    let seen = Exclusive::default();
    let clients = join_all([
        take_hold_release(&two, name, 0, 10_000, Duration::from_millis(2), &seen),
        take_hold_release(&one, name, 1, 10_000, Duration::from_millis(2), &seen),
    ]);
    let holder_side = async {
        until_waiters(&two, 1).await;
        until_waiters(&one, 1).await;
        redis.until_lock_channel_subscribers(name, 2).await;
        until_looked(&one, 1).await;
        until_looked(&two, 1).await;
        sleep(Duration::from_millis(20)).await;
        let before = (acquire_tries(&one).await, acquire_tries(&two).await);
        one.release(name, &a.token()).await.expect_status(204);
        before
    };
    let (replies, (one_before, two_before)) = tokio::join!(clients, holder_side);
    for (who, reply) in replies.iter().enumerate() {
        assert_eq!(reply.status.as_u16(), 201, "client {who}: {}", reply.text);
    }
    assert_fences_grow(&seen.grants());
    // Each head tried at A's release; the loser once more at the winner's.
    let one_tries = acquire_tries(&one).await - one_before;
    let two_tries = acquire_tries(&two).await - two_before;
    assert!(
        one_tries >= 1 && two_tries >= 1,
        "tries: {one_tries} on the releasing instance, {two_tries} on the other"
    );
    assert_eq!(one.lock_key_count().await, 0);
}

/// Two instances on one Redis, four waiters on each for `k`, which A keeps.
/// A release event (published by hand; the lock stays held) makes exactly
/// one try per instance: only each queue's head looks. Then nothing more
/// happens until A really releases, and all eight are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_event_costs_one_try_per_instance_not_one_per_waiter() {
    let one = TestApp::redis().await;
    let two = one.sibling(|_| {}).await;
    let redis = one.redis_server();
    let name = "herd";
    let a = one.acquire_ttl(name, 10_000).await;
    a.expect_status(201);
    let seen = Exclusive::default();
    let clients = join_all((0..8).map(|who| {
        let app = if who % 2 == 0 { &one } else { &two };
        take_hold_release(app, name, who, 10_000, Duration::from_millis(2), &seen)
    }));
    let holder_side = async {
        until_waiters(&one, 4).await;
        until_waiters(&two, 4).await;
        // Each instance subscribes to the lock's changes, then its head
        // looks once (a release may have come before the subscription).
        redis.until_lock_channel_subscribers(name, 2).await;
        until_looked(&one, 1).await;
        until_looked(&two, 1).await;
        sleep(Duration::from_millis(100)).await;
        let (one_before, two_before) = (acquire_tries(&one).await, acquire_tries(&two).await);
        redis.reset_stats().await;
        let _: i64 = redis
            .cmd(
                ::redis::cmd("PUBLISH")
                    .arg(format!("{}:released", lock_key(name)))
                    .arg(""),
            )
            .await;
        sleep(Duration::from_millis(300)).await;
        assert_eq!(
            redis.script_calls().await,
            2,
            "one release event should make one try per instance"
        );
        assert_eq!(acquire_tries(&one).await - one_before, 1);
        assert_eq!(acquire_tries(&two).await - two_before, 1);
        assert_eq!(one.holder_token(name).await, Some(a.token()));
        sleep(Duration::from_millis(200)).await;
        assert_eq!(redis.script_calls().await, 2, "waiters kept trying");
        one.release(name, &a.token()).await.expect_status(204);
    };
    let (replies, ()) = tokio::join!(clients, holder_side);
    for (who, reply) in replies.iter().enumerate() {
        assert_eq!(reply.status.as_u16(), 201, "client {who}: {}", reply.text);
    }
    let grants = seen.grants();
    assert_eq!(grants.len(), 8);
    assert_fences_grow(&grants);
    assert_eq!(one.lock_key_count().await, 0);
}

/// A holds `k`; W waits. The lock then frees without a release event (a
/// foreign client deletes the key), so W sleeps on until A's lease would
/// end. A newcomer N with a wait queues behind W and does not take the free
/// lock, but a fail-fast request C, which is never queued, does. After C's
/// release W is served, then N.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_fast_request_may_take_a_free_lock_ahead_of_the_queue_but_a_waiter_may_not() {
    let app = TestApp::redis().await;
    let redis = app.redis_server();
    let name = "ahead";
    let a = app.acquire_ttl(name, 1500).await;
    a.expect_status(201);
    let order = Mutex::new(Vec::new());
    let (go_n, n_may_go) = oneshot::channel::<()>();
    let take = |who: &'static str, after: Option<oneshot::Receiver<()>>| {
        let order = &order;
        let app = &app;
        async move {
            if let Some(signal) = after {
                signal.await.unwrap();
            }
            let reply = acquire_waiting(app, name, 10_000, 5000).await;
            reply.expect_status(201);
            order.lock().unwrap().push(who);
            sleep(Duration::from_millis(20)).await;
            app.release(name, &reply.token()).await.expect_status(204);
        }
    };
    let coordinator = async {
        until_waiters(&app, 1).await;
        let deleted: i64 = redis
            .cmd(
                ::redis::cmd("DEL")
                    .arg(lock_key(name))
                    .arg(format!("{}:meta", lock_key(name))),
            )
            .await;
        assert_eq!(deleted, 2);
        go_n.send(()).unwrap();
        until_waiters(&app, 2).await;
        sleep(Duration::from_millis(100)).await;
        assert_eq!(
            app.holder(name).await,
            None,
            "a queued request took the lock ahead of the head's retry time"
        );
        let c = app.acquire_ttl(name, 10_000).await;
        c.expect_status(201);
        order.lock().unwrap().push("C");
        assert_eq!(waiters(&app).await, 2);
        sleep(Duration::from_millis(100)).await;
        app.release(name, &c.token()).await.expect_status(204);
    };
    tokio::join!(take("W", None), take("N", Some(n_may_go)), coordinator);
    assert_eq!(*order.lock().unwrap(), ["C", "W", "N"]);
    assert_eq!(app.lock_key_count().await, 0);
}

// ---------------------------------------------------------------------------
// Several instances on one Redis
// ---------------------------------------------------------------------------

/// Waits, for at most 10 s, until `app` has looked whether a lock is held
/// (`inspect`) at least `n` times: a waiter's head looks once after its
/// instance subscribed to the lock's changes.
async fn until_looked(app: &TestApp, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = app.metrics().await;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let looked = metric(
            &text,
            "lockd_backend_duration_seconds_count",
            &[("op", "inspect")],
        )
        .unwrap_or(0.0) as u64;
        if looked >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{looked} looks, expected {n}");
        sleep(Duration::from_millis(10)).await;
    }
}

/// A holds `name` on `holder`; B waits on `waiter`; A releases. B must be
/// granted within 300 ms of the release (A's lease had 10 s left).
async fn release_on_one_wakes_waiter_on_other(holder: &TestApp, waiter: &TestApp, name: &str) {
    let a = holder.acquire_ttl(name, 10_000).await;
    a.expect_status(201);
    let (b, released_at) = tokio::join!(
        async {
            let b = acquire_waiting(waiter, name, 10_000, 5000).await;
            (b, Instant::now())
        },
        async {
            until_waiters(waiter, 1).await;
            // The waiter's instance hears the release as it happens.
            waiter
                .redis_server()
                .until_lock_channel_subscribers(name, 1)
                .await;
            sleep(Duration::from_millis(50)).await;
            let at = Instant::now();
            holder.release(name, &a.token()).await.expect_status(204);
            at
        }
    );
    let (b, granted_at) = b;
    b.expect_status(201);
    let after = granted_at.duration_since(released_at);
    assert!(
        after < Duration::from_millis(300),
        "the waiter got the lock {after:?} after the release on the other instance"
    );
    waiter.release(name, &b.token()).await.expect_status(204);
}

/// Two instances on one Redis. A lock nobody waits for is heard by no
/// instance: no pattern subscription, no subscriber to its channel, so its
/// grants and releases are delivered nowhere. While B waits on instance
/// two, two alone subscribes to the lock's channel, and A's release on one
/// reaches it; once B is served and gone, nobody is subscribed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_hears_a_lock_only_while_it_waits_for_it() {
    let one = TestApp::redis().await;
    let two = one.sibling(|_| {}).await;
    let redis = one.redis_server();
    let name = "quiet";
    let a = one.acquire_ttl(name, 10_000).await;
    a.expect_status(201);
    let patterns: i64 = redis.cmd(::redis::cmd("PUBSUB").arg("NUMPAT")).await;
    assert_eq!(patterns, 0, "a pattern subscription hears every lock");
    assert_eq!(redis.lock_channel_subscribers(name).await, 0);
    let (b, ()) = tokio::join!(acquire_waiting(&two, name, 10_000, 5000), async {
        until_waiters(&two, 1).await;
        redis.until_lock_channel_subscribers(name, 1).await;
        one.release(name, &a.token()).await.expect_status(204);
    });
    b.expect_status(201);
    two.release(name, &b.token()).await.expect_status(204);
    redis.until_lock_channel_subscribers(name, 0).await;
    // A cycle nobody waits for: its two messages find no subscriber.
    let c = one.acquire_ttl(name, 10_000).await;
    c.expect_status(201);
    one.release(name, &c.token()).await.expect_status(204);
    let listeners: i64 = redis
        .cmd(
            ::redis::cmd("PUBLISH")
                .arg(format!("{}:released", lock_key(name)))
                .arg(""),
        )
        .await;
    assert_eq!(
        listeners, 0,
        "an instance still hears a lock nobody waits for"
    );
}

/// A release on one instance wakes a waiter on another at once, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_one_instance_wakes_a_waiter_on_another() {
    let one = TestApp::redis().await;
    let two = one.sibling(|_| {}).await;
    release_on_one_wakes_waiter_on_other(&one, &two, "shared").await;
    release_on_one_wakes_waiter_on_other(&two, &one, "shared").await;
    assert_eq!(one.lock_key_count().await, 0);
}

/// Redis restarts (and loses its data) while B waits on instance 2 for a
/// lock A took on instance 1 with 10 s left. B must get the lock soon after
/// Redis is back (its subscriber reconnects and every head retries), not at
/// A's old expiry. After that, release events flow again both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_lock_after_a_redis_restart_and_release_events_resume() {
    let one = TestApp::redis().await;
    let two = one.sibling(|_| {}).await;
    let redis = one.redis_server();
    let name = "restart";
    let a = one.acquire_ttl(name, 10_000).await;
    a.expect_status(201);
    let (b, restarted_at) = tokio::join!(
        async {
            let b = acquire_waiting(&two, name, 10_000, 8000).await;
            (b, Instant::now())
        },
        async {
            until_waiters(&two, 1).await;
            // B counts as waiting from the moment it joins the queue, before
            // its first try has come back (a restart in the middle of that
            // try ends the wait with 503, as any failed try does).
            let deadline = Instant::now() + Duration::from_secs(5);
            while acquire_tries(&two).await < 1 {
                assert!(Instant::now() < deadline, "B's first try never ended");
                sleep(Duration::from_millis(5)).await;
            }
            // B's instance is subscribed to the lock's changes, so it is the
            // subscription's return that wakes B.
            redis.until_lock_channel_subscribers(name, 1).await;
            redis.stop();
            sleep(Duration::from_millis(300)).await;
            redis.start().await;
            Instant::now()
        }
    );
    let (b, granted_at) = b;
    b.expect_status(201);
    let after = granted_at.duration_since(restarted_at);
    assert!(
        after < Duration::from_secs(3),
        "B got the lock {after:?} after Redis came back"
    );
    assert_eq!(one.holder_token(name).await, Some(b.token()));
    two.release(name, &b.token()).await.expect_status(204);

    release_on_one_wakes_waiter_on_other(&one, &two, "after-restart").await;
    release_on_one_wakes_waiter_on_other(&two, &one, "after-restart").await;
    assert_eq!(one.lock_key_count().await, 0);
}

/// A holds `k` with 10 s left; W1 waits at the head, W2 behind it with a
/// 300 ms wait. W2's wait runs out: its 409 must say when the lock frees at
/// the latest (about A's remaining lease), as the head's would, not "1 ms".
async fn a_timed_out_waiter_behind_the_head_is_told_when_the_lock_frees(app: &TestApp) {
    let name = "told";
    let a = app.acquire_ttl(name, 10_000).await;
    a.expect_status(201);
    let (w1, w2) = tokio::join!(acquire_waiting(app, name, 10_000, 1500), async {
        until_waiters(app, 1).await;
        acquire_waiting(app, name, 10_000, 300).await
    });
    for (who, reply) in [("W1 (head)", &w1), ("W2 (behind the head)", &w2)] {
        let problem = reply.expect_problem(409, "lock-held");
        let retry_ms = problem["retry_after_ms"].as_u64().expect("retry_after_ms");
        let (_, pttl) = app.holder(name).await.expect("A still holds");
        assert!(
            retry_ms + 50 >= u64::try_from(pttl).unwrap() && retry_ms <= 10_000,
            "{who}: retry_after_ms {retry_ms}, but A's lease has {pttl} ms left"
        );
        assert_eq!(
            reply.header("retry-after"),
            Some(retry_ms.div_ceil(1000).to_string()),
            "{who}"
        );
    }
    app.release(name, &a.token()).await.expect_status(204);
}

// ---------------------------------------------------------------------------
// Limits and shutdown
// ---------------------------------------------------------------------------

/// With `max_waiters` 2 and two requests waiting, a third that would wait
/// gets 503 `too-many-waiters` with `Retry-After` at once, while `/healthz`,
/// `/readyz`, `/metrics`, fail-fast acquires and other routes still work.
/// Once the waiters are served, waiting is accepted again.
async fn a_full_wait_queue_answers_503_and_everything_else_still_works(app: &TestApp) {
    let name = "full";
    let a = app.acquire_ttl(name, 10_000).await;
    a.expect_status(201);
    let seen = Exclusive::default();
    let waiting = join_all(
        (0..2).map(|who| take_hold_release(app, name, who, 5000, Duration::from_millis(2), &seen)),
    );
    let checks = async {
        until_waiters(app, 2).await;
        for reply in [
            acquire_waiting(app, name, 10_000, 1000).await,
            app.send(
                Method::POST,
                &format!("/locks/{name}?wait_ms=1000"),
                &[],
                None,
            )
            .await,
        ] {
            reply.expect_problem(503, "too-many-waiters");
            let retry: u64 = reply
                .header("retry-after")
                .expect("Retry-After")
                .parse()
                .unwrap();
            assert!(retry >= 1, "Retry-After {retry}");
        }
        app.get("/healthz").await.expect_status(200);
        app.get("/readyz").await.expect_status(200);
        let text = app.metrics().await;
        assert_eq!(metric(&text, "lockd_waiters", &[]), Some(2.0));
        app.acquire_ttl(name, 1000)
            .await
            .expect_problem(409, "lock-held");
        let other = app.acquire_ttl("elsewhere", 1000).await;
        other.expect_status(201);
        app.inspect(name).await.expect_status(200);
        app.extend_ttl("elsewhere", &other.token(), 1000)
            .await
            .expect_status(200);
        app.release("elsewhere", &other.token())
            .await
            .expect_status(204);
        app.release(name, &a.token()).await.expect_status(204);
    };
    let (replies, ()) = tokio::join!(waiting, checks);
    for reply in &replies {
        reply.expect_status(201);
    }
    // Room again.
    let b = app.acquire_ttl(name, 10_000).await;
    b.expect_status(201);
    let (again, ()) = tokio::join!(acquire_waiting(app, name, 1000, 3000), async {
        until_waiters(app, 1).await;
        app.release(name, &b.token()).await.expect_status(204);
    });
    again.expect_status(201);
    app.release(name, &again.token()).await.expect_status(204);
    assert_eq!(app.lock_key_count().await, 0);
}

/// With `max_waiters` 2 and two requests waiting for `hot`, a request with a
/// wait for the free lock `cold` would not wait: it must be granted, not
/// refused as if it had to queue.
async fn a_waiting_request_for_a_free_lock_is_granted_when_the_queue_is_full(app: &TestApp) {
    let a = app.acquire_ttl("hot", 10_000).await;
    a.expect_status(201);
    let seen = Exclusive::default();
    let waiting = join_all(
        (0..2).map(|who| take_hold_release(app, "hot", who, 5000, Duration::from_millis(2), &seen)),
    );
    let checks = async {
        until_waiters(app, 2).await;
        let cold = acquire_waiting(app, "cold", 1000, 1000).await;
        app.release("hot", &a.token()).await.expect_status(204);
        cold
    };
    let (replies, cold) = tokio::join!(waiting, checks);
    for reply in &replies {
        reply.expect_status(201);
    }
    cold.expect_status(201);
    app.release("cold", &cold.token()).await.expect_status(204);
}

/// Shutting down (SIGTERM in `main`) ends a wait at once with 503
/// `shutting-down` and `Retry-After`; the waiter takes no lock, and the
/// server stops.
async fn shutdown_ends_a_wait_with_503_shutting_down(app: &TestApp) {
    let name = "closing";
    let a = app.acquire_ttl(name, 10_000).await;
    a.expect_status(201);
    let (w, shut_at) = tokio::join!(
        async {
            let w = acquire_waiting(app, name, 10_000, 8000).await;
            (w, Instant::now())
        },
        async {
            until_waiters(app, 1).await;
            app.shut_down();
            Instant::now()
        }
    );
    let (w, answered_at) = w;
    w.expect_problem(503, "shutting-down");
    assert!(w.header("retry-after").is_some(), "no Retry-After");
    let after = answered_at.duration_since(shut_at);
    assert!(
        after < Duration::from_secs(1),
        "the wait ended {after:?} after shutdown began"
    );
    assert!(
        app.stopped_within(Duration::from_secs(5)).await,
        "the server did not stop"
    );
    assert_eq!(app.holder_token(name).await, Some(a.token()));
}

// ---------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------

/// `lockd_waiters` counts the requests waiting now; a wait that runs out is
/// a 409 `lock-held` with `retry_after_ms` and `Retry-After`, counted in
/// `lockd_acquire_total{result="timeout"}` and timed, waiting included, in
/// `lockd_acquire_wait_seconds{result="timeout"}`.
async fn metrics_show_waiters_timeouts_and_wait_times(app: &TestApp) {
    let name = "watched";
    let text = app.metrics().await;
    let value = |text: &str, metric_name: &str, labels: &[(&str, &str)]| {
        metric(text, metric_name, labels).unwrap_or_else(|| panic!("no {metric_name}{labels:?}"))
    };
    assert_eq!(value(&text, "lockd_waiters", &[]), 0.0);
    let timeouts = value(&text, "lockd_acquire_total", &[("result", "timeout")]);
    let timeout_samples = value(
        &text,
        "lockd_acquire_wait_seconds_count",
        &[("result", "timeout")],
    );
    let acquired_samples = value(
        &text,
        "lockd_acquire_wait_seconds_count",
        &[("result", "acquired")],
    );

    let a = app.acquire_ttl(name, 10_000).await;
    a.expect_status(201);
    let seen = Exclusive::default();
    // The short wait outlasts the other two's arrival on a busy machine;
    // they outlast it and A's release.
    let (short, long, ()) = tokio::join!(
        async {
            let path = format!("/locks/{name}?wait_ms=3000&ttl_ms=10000");
            app.send(Method::POST, &path, &[], None).await
        },
        async {
            until_waiters(app, 1).await;
            join_all((1..3).map(|who| {
                take_hold_release(app, name, who, 30_000, Duration::from_millis(2), &seen)
            }))
            .await
        },
        async {
            until_waiters(app, 3).await;
            // The short wait runs out; the other two still wait.
            until_waiters(app, 2).await;
            let text = app.metrics().await;
            assert_eq!(
                value(&text, "lockd_acquire_total", &[("result", "timeout")]),
                timeouts + 1.0
            );
            assert_eq!(
                value(
                    &text,
                    "lockd_acquire_wait_seconds_count",
                    &[("result", "timeout")]
                ),
                timeout_samples + 1.0
            );
            let waited = value(
                &text,
                "lockd_acquire_wait_seconds_sum",
                &[("result", "timeout")],
            );
            assert!(
                waited >= 3.0,
                "the timed-out wait was recorded as {waited} s"
            );
            app.release(name, &a.token()).await.expect_status(204);
        }
    );
    let problem = short.expect_problem(409, "lock-held");
    let retry_ms = problem["retry_after_ms"]
        .as_u64()
        .expect("retry_after_ms in a timed-out wait");
    assert!(
        retry_ms > 0 && retry_ms <= 10_000,
        "retry_after_ms {retry_ms} is not within the holder's lease"
    );
    let retry: u64 = short
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert_eq!(retry, retry_ms.div_ceil(1000));

    // The two long waiters were served in turn, and counted with A's grant.
    for reply in &long {
        reply.expect_status(201);
    }
    assert_eq!(seen.grants().len(), 2);
    assert_eq!(waiters(app).await, 0);
    let text = app.metrics().await;
    assert_eq!(
        value(
            &text,
            "lockd_acquire_wait_seconds_count",
            &[("result", "acquired")]
        ),
        acquired_samples + 3.0
    );
    assert_eq!(app.lock_key_count().await, 0);
}

/// A holder's retry (its own token, with `wait_ms`) that would queue
/// behind another waiter renews at once: 200, the same fence, a fresh
/// lease; it does not wait behind a waiter for a lock it holds.
async fn a_holders_retry_queued_behind_a_waiter_renews_at_once(app: &TestApp) {
    let token = random_token();
    let body = |ttl_ms: u64, wait_ms: u64| {
        Some(json!({"token": token, "ttl_ms": ttl_ms, "wait_ms": wait_ms}))
    };
    let held = app.acquire("own", body(30_000, 0)).await;
    held.expect_status(201);
    let waiter = app.spawn_wait("own", 10_000, 3_000);
    until_waiters(app, 1).await;
    let started = Instant::now();
    let again = app.acquire("own", body(40_000, 2_000)).await;
    again.expect_status(200);
    assert_eq!(again.fence(), held.fence());
    assert_lease_ms(again.json()["ttl_ms"].as_u64(), 40_000, started);
    assert!(
        started.elapsed() < Duration::from_millis(1_000),
        "renewed after {:?}",
        started.elapsed()
    );
    assert_eq!(app.holder_token("own").await, Some(token.clone()));
    let refused = waiter.await.expect("task").expect("answer");
    refused.expect_problem(409, "lock-held");
}
