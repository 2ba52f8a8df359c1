//! Semaphores through HTTP, as clients use them: `/semaphores/{name}` on a
//! real Redis and on the memory backend (the same answers), field cases
//! C18–C21, a concurrency test that samples holders, the place of a permit
//! given back or run out, bad input, cancel safety, two instances, a Redis
//! Cluster, and Redlock's refusal.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::support::{
    Reply, TestApp, assert_lease_ms, eventually, metric, ms_until, random_token, shared_cluster,
};

crate::support::redis_and_memory_tests!(
    c18_semaphore_reacquire_takes_no_second_permit,
    c20_semaphore_wakeup_a_freed_permit_wakes_a_waiter,
    a_permit_that_runs_out_wakes_a_waiter_and_is_free_at_once,
    c19_semaphore_atomic_never_more_than_the_limit,
    bad_input_is_refused_with_a_problem_and_writes_nothing,
    the_limit_is_set_by_the_first_permit_and_stays_while_any_is_held,
    extend_and_give_back_of_a_permit_not_held_are_404_and_create_nothing,
    extend_resets_the_lease_to_the_given_or_own_ttl,
    a_caller_who_hangs_up_mid_wait_is_never_left_holding_a_permit,
    a_wait_that_runs_out_is_full_with_when_the_earliest_permit_ends,
    a_semaphore_and_a_lock_of_one_name_are_unrelated,
    the_listing_never_shows_a_token,
    semaphore_metrics_count_grants_refusals_and_hold_time,
    a_queued_request_with_another_limit_is_refused_at_once,
    a_holders_retry_queued_behind_a_waiter_renews_at_once,
    a_permit_never_runs_out_before_its_ttl,
    a_permit_given_back_while_full_goes_to_a_refused_client_with_a_higher_fence,
    a_permit_shortened_by_extend_runs_out_is_never_revived_and_frees_its_place,
);

fn path(name: &str) -> String {
    format!("/semaphores/{name}")
}

/// `POST /semaphores/{name}` with `body`.
async fn take(app: &TestApp, name: &str, body: Value) -> Reply {
    app.send_json(Method::POST, &path(name), &[], Some(body))
        .await
}

/// `POST /semaphores/{name}` with `body` and the token in `Lock-Token`.
async fn take_as(app: &TestApp, name: &str, token: &str, body: Value) -> Reply {
    app.send_json(
        Method::POST,
        &path(name),
        &[("Lock-Token", token)],
        Some(body),
    )
    .await
}

/// `DELETE /semaphores/{name}` with the token.
async fn give_back(app: &TestApp, name: &str, token: &str) -> Reply {
    app.send(Method::DELETE, &path(name), &[("Lock-Token", token)], None)
        .await
}

/// `PATCH /semaphores/{name}` with the token and an optional body.
async fn extend(app: &TestApp, name: &str, token: &str, body: Option<Value>) -> Reply {
    app.send_json(Method::PATCH, &path(name), &[("Lock-Token", token)], body)
        .await
}

/// `GET /semaphores/{name}`.
async fn status(app: &TestApp, name: &str) -> Reply {
    app.get(&path(name)).await
}

/// How many permits `GET` shows (0 for a 404). A read that Redis did not
/// answer in time (503 `backend-unavailable`, on a machine so busy that
/// Redis is starved) is read again, as a client would, for up to 10 s.
async fn holders(app: &TestApp, name: &str) -> usize {
    let until = Instant::now() + Duration::from_secs(10);
    let mut reply = status(app, name).await;
    while reply.status == 503 && Instant::now() < until {
        assert_eq!(
            reply.json()["type"],
            "urn:lockd:problem:backend-unavailable",
            "{}",
            reply.text
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        reply = status(app, name).await;
    }
    if reply.status == 404 {
        return 0;
    }
    reply.expect_status(200);
    let body = reply.json();
    let shown = body["permits"].as_array().expect("permits").len();
    assert_eq!(body["holders"], shown, "{}", reply.text);
    shown
}

/// A permit request on its own task, through a client that gives up after
/// `give_up`: its answer, or `Err` when none came by then.
fn spawn_take(
    app: &TestApp,
    name: &str,
    body: Value,
    give_up: Duration,
) -> JoinHandle<Result<Reply, reqwest::Error>> {
    let client = TestApp::client_with_timeout(give_up);
    let request = client.post(app.url(&path(name))).json(&body);
    tokio::spawn(async move { Reply::read(request.send().await?).await })
}

/// As [`spawn_take`], with the caller's own token.
fn spawn_take_as(
    app: &TestApp,
    name: &str,
    token: &str,
    body: Value,
    give_up: Duration,
) -> JoinHandle<Result<Reply, reqwest::Error>> {
    let client = TestApp::client_with_timeout(give_up);
    let request = client
        .post(app.url(&path(name)))
        .header("Lock-Token", token)
        .json(&body);
    tokio::spawn(async move { Reply::read(request.send().await?).await })
}

async fn c18_semaphore_reacquire_takes_no_second_permit(app: &TestApp) {
    let a = random_token();
    let first = take_as(app, "pool", &a, json!({"limit": 2, "ttl_ms": 10_000})).await;
    first.expect_status(201);
    assert_eq!(first.u64("limit"), 2);
    assert_eq!(first.token(), a);
    // A retry (its first answer lost): the same permit, renewed.
    let again = take_as(app, "pool", &a, json!({"limit": 2, "ttl_ms": 10_000})).await;
    again.expect_status(200);
    assert_eq!(again.fence(), first.fence(), "same fence");
    assert_eq!(holders(app, "pool").await, 1, "A counts once");
    // B and C can take only one permit between them.
    let b = take(app, "pool", json!({"limit": 2})).await;
    b.expect_status(201);
    assert!(b.fence() > first.fence(), "fences grow");
    let c = take(app, "pool", json!({"limit": 2})).await;
    let problem = c.expect_problem(409, "semaphore-full");
    assert_eq!(problem["limit"], 2);
    assert!(problem["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0));
    assert!(c.header("retry-after").is_some());
    assert_eq!(holders(app, "pool").await, 2);
}

/// A full semaphore (limit 2): the client refused gets the place a holder
/// gives back, at once, with a fence above both earlier ones, while the
/// other holder keeps its permit.
async fn a_permit_given_back_while_full_goes_to_a_refused_client_with_a_higher_fence(
    app: &TestApp,
) {
    let a = take(app, "freed", json!({"limit": 2, "ttl_ms": 10_000})).await;
    a.expect_status(201);
    let b = take(app, "freed", json!({"limit": 2, "ttl_ms": 10_000})).await;
    b.expect_status(201);
    let c = random_token();
    take_as(app, "freed", &c, json!({"limit": 2, "ttl_ms": 10_000}))
        .await
        .expect_problem(409, "semaphore-full");
    give_back(app, "freed", &a.token()).await.expect_status(204);
    let third = take_as(app, "freed", &c, json!({"limit": 2, "ttl_ms": 10_000})).await;
    third.expect_status(201);
    assert_eq!(third.token(), c);
    assert!(
        third.fence() > a.fence() && third.fence() > b.fence(),
        "fence {} after {} and {}",
        third.fence(),
        a.fence(),
        b.fence()
    );
    let listed = status(app, "freed").await;
    listed.expect_status(200);
    let fences: HashSet<u64> = listed.json()["permits"]
        .as_array()
        .expect("permits")
        .iter()
        .map(|p| p["fence"].as_u64().expect("fence"))
        .collect();
    assert_eq!(
        fences,
        HashSet::from([b.fence(), third.fence()]),
        "{}",
        listed.text
    );
}

/// A permit extended to a shorter lease runs out at its new end, while
/// another permit of the semaphore is still held: from then on an extend
/// with the permit's own TTL (no body) is 404 and recreates nothing, `GET`
/// shows only the other permit, and a newcomer takes the place at once.
async fn a_permit_shortened_by_extend_runs_out_is_never_revived_and_frees_its_place(app: &TestApp) {
    const SHORT: Duration = Duration::from_millis(50);
    let a = take(app, "lapse", json!({"limit": 2, "ttl_ms": 10_000})).await;
    a.expect_status(201);
    let b = take(app, "lapse", json!({"limit": 2, "ttl_ms": 10_000})).await;
    b.expect_status(201);
    let shortened = extend(
        app,
        "lapse",
        &b.token(),
        Some(json!({"ttl_ms": SHORT.as_millis()})),
    )
    .await;
    shortened.expect_status(200);
    assert_eq!(shortened.fence(), b.fence());
    // The lease was reset before its answer came, so it has surely ended
    // this long after the answer, however late the timer fires.
    tokio::time::sleep(SHORT + Duration::from_millis(70)).await;
    extend(app, "lapse", &b.token(), None)
        .await
        .expect_problem(404, "permit-not-held");
    let listed = status(app, "lapse").await;
    listed.expect_status(200);
    let permits = listed.json()["permits"].clone();
    assert_eq!(
        permits.as_array().expect("permits").len(),
        1,
        "the lapsed permit is free at once: {}",
        listed.text
    );
    assert_eq!(permits[0]["fence"], a.fence(), "{}", listed.text);
    take(app, "lapse", json!({"limit": 2}))
        .await
        .expect_status(201);
    assert_eq!(holders(app, "lapse").await, 2);
}

async fn c20_semaphore_wakeup_a_freed_permit_wakes_a_waiter(app: &TestApp) {
    const WAITERS: usize = 20;
    const HOLD: Duration = Duration::from_millis(50);
    let first = take(app, "chain", json!({"limit": 1, "ttl_ms": 30_000})).await;
    first.expect_status(201);
    let started = Instant::now();
    let mut chain = Vec::new();
    for _ in 0..WAITERS {
        let (app_url, client) = (app.url(&path("chain")), app.client.clone());
        chain.push(tokio::spawn(async move {
            let reply = client
                .post(&app_url)
                .json(&json!({"limit": 1, "ttl_ms": 30_000, "wait_ms": 30_000}))
                .send()
                .await
                .expect("answer");
            let reply = Reply::read(reply).await.expect("body");
            reply.expect_status(201);
            tokio::time::sleep(HOLD).await;
            let token = reply.token();
            let gone = client
                .delete(&app_url)
                .header("Lock-Token", token)
                .send()
                .await
                .expect("answer");
            assert_eq!(gone.status(), 204);
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    give_back(app, "chain", &first.token())
        .await
        .expect_status(204);
    for waiter in chain {
        waiter.await.expect("waiter");
    }
    let took = started.elapsed();
    // About the sum of the holds (1 s), far from a waiter's wait (30 s).
    assert!(
        took < Duration::from_secs(6),
        "the chain of {WAITERS} took {took:?}"
    );
    assert_eq!(holders(app, "chain").await, 0);
}

async fn a_permit_that_runs_out_wakes_a_waiter_and_is_free_at_once(app: &TestApp) {
    // A holder that crashed: its permit is never given back.
    take(app, "crash", json!({"limit": 1, "ttl_ms": 400}))
        .await
        .expect_status(201);
    let started = Instant::now();
    let waiter = take(
        app,
        "crash",
        json!({"limit": 1, "ttl_ms": 5_000, "wait_ms": 10_000}),
    )
    .await;
    waiter.expect_status(201);
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1_500),
        "woken when the permit ran out: {took:?}"
    );
    // And without waiting: once a permit has run out, it is free.
    take(app, "crash2", json!({"limit": 1, "ttl_ms": 100}))
        .await
        .expect_status(201);
    tokio::time::sleep(Duration::from_millis(150)).await;
    take(app, "crash2", json!({"limit": 1}))
        .await
        .expect_status(201);
}

/// 50 clients on limit 3 for 3 s, leases close to their hold times; one
/// in five never gives its permit back (a crash), one in five hangs up
/// mid-request. A sampler reading `GET` never sees more than 3 permits,
/// and no more than 3 clients hold a valid lease at once: each counts from
/// the 201's arrival to its give-back or to its lease's earliest end (the
/// answer's `expires_at`), whichever comes first, so a client the
/// machine's load kept asleep past its lease does not count.
async fn c19_semaphore_atomic_never_more_than_the_limit(app: &TestApp) {
    never_more_than_the_limit(app, "busy").await;
}

/// The most intervals of `held` that overlap at one instant.
fn most_at_once(held: &[(Instant, Instant)]) -> usize {
    let mut edges: Vec<(Instant, i32)> = held
        .iter()
        .flat_map(|(from, to)| [(*from, 1), (*to, -1)])
        .collect();
    // At one instant an end comes before a start: touching is no overlap.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

async fn never_more_than_the_limit(app: &TestApp, name: &str) {
    const LIMIT: usize = 3;
    const TTL: Duration = Duration::from_millis(120);
    let stop = Arc::new(AtomicBool::new(false));
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let grants = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for i in 0..50 {
        let (stop, held, grants) = (stop.clone(), held.clone(), grants.clone());
        let url = app.url(&path(name));
        clients.push(tokio::spawn(async move {
            let client = TestApp::client_with_timeout(Duration::from_millis(if i % 5 == 1 {
                20
            } else {
                5_000
            }));
            while !stop.load(Ordering::Relaxed) {
                let answer = client
                    .post(&url)
                    .json(&json!({"limit": LIMIT, "ttl_ms": TTL.as_millis(), "wait_ms": 300}))
                    .send()
                    .await;
                let Ok(answer) = answer else { continue };
                let Ok(reply) = Reply::read(answer).await else {
                    continue;
                };
                if reply.status != 201 {
                    // Full, or (on a busy machine) Redis slow to answer.
                    assert!(
                        reply.status == 409 || reply.status == 503,
                        "{} {}",
                        reply.status,
                        reply.text
                    );
                    continue;
                }
                let got = Instant::now();
                let valid_for = ms_until(&reply.str("expires_at"));
                let valid_until =
                    got + Duration::from_millis(u64::try_from(valid_for).unwrap_or(0));
                grants.fetch_add(1, Ordering::Relaxed);
                // Hold for half the lease, then give back (or not).
                tokio::time::sleep(TTL / 2).await;
                let end = Instant::now().min(valid_until);
                if end > got {
                    held.lock().unwrap().push((got, end));
                }
                if i % 5 != 0 {
                    let _ = client
                        .delete(&url)
                        .header("Lock-Token", reply.token())
                        .send()
                        .await;
                }
            }
        }));
    }
    let mut samples = 0;
    let mut most_seen = 0;
    // At least 3 s of load, and until the sampler has seen enough and
    // permits changed hands often enough (a busy machine takes longer);
    // a run that gets nowhere in a minute fails below.
    let at_least = Instant::now() + Duration::from_secs(3);
    let give_up = Instant::now() + Duration::from_secs(60);
    while (Instant::now() < at_least || samples < 50 || grants.load(Ordering::Relaxed) < 20)
        && Instant::now() < give_up
    {
        let seen = holders(app, name).await;
        most_seen = most_seen.max(seen);
        samples += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("client");
    }
    let most = most_at_once(&held.lock().unwrap());
    eprintln!(
        "{name}: {samples} samples, most permits seen {most_seen}, most clients holding a valid lease {most}, {} grants",
        grants.load(Ordering::Relaxed)
    );
    assert!(samples >= 50, "{samples} samples");
    assert!(
        grants.load(Ordering::Relaxed) >= 20,
        "permits changed hands: {}",
        grants.load(Ordering::Relaxed)
    );
    assert!(most_seen <= LIMIT, "a sample saw {most_seen} permits");
    assert!(most_seen >= 1, "a sample saw a permit");
    assert!(most <= LIMIT, "{most} clients held a valid lease at once");
}

/// A request's extra headers.
type Headers = &'static [(&'static str, &'static str)];

async fn bad_input_is_refused_with_a_problem_and_writes_nothing(app: &TestApp) {
    let refused: Vec<(String, Option<Value>, Headers)> = vec![
        (path("p"), Some(json!({})), &[]),
        (path("p"), None, &[]),
        (path("p"), Some(json!({"limit": 0})), &[]),
        (path("p"), Some(json!({"limit": -1})), &[]),
        (path("p"), Some(json!({"limit": 10_001})), &[]),
        (path("p"), Some(json!({"limit": 4_294_967_297_u64})), &[]),
        (path("p"), Some(json!({"limit": "3"})), &[]),
        (path("p"), Some(json!({"limit": 2.5})), &[]),
        (path("p"), Some(json!({"limit": null})), &[]),
        (path("p"), Some(json!({"limit": 2, "colour": "red"})), &[]),
        (path("p"), Some(json!({"limit": 2, "ttl_ms": 0})), &[]),
        (
            path("p"),
            Some(json!({"limit": 2, "ttl_ms": 3_600_001})),
            &[],
        ),
        (path("p"), Some(json!({"limit": 2, "ttl_ms": "1000"})), &[]),
        (path("p"), Some(json!({"limit": 2, "wait_ms": -1})), &[]),
        (path("p"), Some(json!({"limit": 2, "wait_ms": 60_001})), &[]),
        (
            path("p"),
            Some(json!({"limit": 2, "owner": "a\u{7}b"})),
            &[],
        ),
        (path("p"), Some(json!({"limit": 2, "token": "short"})), &[]),
        (path("p"), Some(json!([2])), &[]),
        (format!("{}?limit=0", path("p")), None, &[]),
        (format!("{}?limit=x", path("p")), None, &[]),
        (format!("{}?limit=-2", path("p")), None, &[]),
        (format!("{}?limit=2.0", path("p")), None, &[]),
        (
            format!("{}?limit=2", path("p")),
            Some(json!({"limit": 2})),
            &[],
        ),
        (
            format!("{}?limit=2&token=abcdefghijklmnopqrstu", path("p")),
            None,
            &[],
        ),
        (format!("{}?limit=2&limit=3", path("p")), None, &[]),
        (path("a%20b"), Some(json!({"limit": 2})), &[]),
        (path(".."), Some(json!({"limit": 2})), &[]),
        (
            path("p"),
            Some(json!({"limit": 2})),
            &[("Lock-Token", "bad token!")],
        ),
    ];
    for (target, body, headers) in refused {
        let reply = app
            .send_json(Method::POST, &target, headers, body.clone())
            .await;
        assert!(
            reply.status == 400 || reply.status == 404,
            "POST {target} {body:?}: {} {}",
            reply.status,
            reply.text
        );
        if reply.status == 400 {
            reply.expect_problem(400, "invalid-request");
        }
    }
    // PATCH and DELETE without a token, or with a bad TTL.
    for (method, body) in [
        (Method::PATCH, None),
        (Method::DELETE, None),
        (Method::PATCH, Some(json!({"ttl_ms": 0}))),
        (Method::PATCH, Some(json!({"ttl_ms": 1, "limit": 2}))),
    ] {
        let reply = app.send_json(method.clone(), &path("p"), &[], body).await;
        reply.expect_problem(400, "invalid-request");
    }
    assert_eq!(app.lock_key_count().await, 0, "nothing was written");
    // A good request after all that: the semaphore was never touched.
    take(app, "p", json!({"limit": 1})).await.expect_status(201);
}

async fn the_limit_is_set_by_the_first_permit_and_stays_while_any_is_held(app: &TestApp) {
    let a = take(app, "lim", json!({"limit": 2})).await;
    a.expect_status(201);
    for other in [1, 3] {
        let reply = take(app, "lim", json!({"limit": other})).await;
        let problem = reply.expect_problem(409, "limit-mismatch");
        assert_eq!(problem["limit"], 2, "names the held limit");
    }
    // Even the holder's own retry must name the same limit.
    let mine = take_as(app, "lim", &a.token(), json!({"limit": 5})).await;
    mine.expect_problem(409, "limit-mismatch");
    give_back(app, "lim", &a.token()).await.expect_status(204);
    // Once no permit is held, a new limit is taken.
    let fresh = take(app, "lim", json!({"limit": 3})).await;
    fresh.expect_status(201);
    assert_eq!(fresh.u64("limit"), 3);
    assert!(fresh.fence() > a.fence());
}

async fn extend_and_give_back_of_a_permit_not_held_are_404_and_create_nothing(app: &TestApp) {
    let stranger = random_token();
    extend(app, "none", &stranger, None)
        .await
        .expect_problem(404, "permit-not-held");
    give_back(app, "none", &stranger)
        .await
        .expect_problem(404, "permit-not-held");
    status(app, "none")
        .await
        .expect_problem(404, "semaphore-free");
    assert_eq!(app.lock_key_count().await, 0);
    // A permit given back, then extended: 404, never recreated.
    let held = take(app, "gone", json!({"limit": 2, "ttl_ms": 200})).await;
    held.expect_status(201);
    give_back(app, "gone", &held.token())
        .await
        .expect_status(204);
    give_back(app, "gone", &held.token())
        .await
        .expect_problem(404, "permit-not-held");
    extend(app, "gone", &held.token(), Some(json!({"ttl_ms": 5_000})))
        .await
        .expect_problem(404, "permit-not-held");
    // And one that ran out.
    let lapsed = take(app, "gone", json!({"limit": 2, "ttl_ms": 100})).await;
    lapsed.expect_status(201);
    tokio::time::sleep(Duration::from_millis(200)).await;
    extend(app, "gone", &lapsed.token(), Some(json!({"ttl_ms": 5_000})))
        .await
        .expect_problem(404, "permit-not-held");
    assert_eq!(holders(app, "gone").await, 0);
    assert_eq!(app.lock_key_count().await, 0);
}

async fn extend_resets_the_lease_to_the_given_or_own_ttl(app: &TestApp) {
    let held = take(app, "ext", json!({"limit": 2, "ttl_ms": 3_000})).await;
    held.expect_status(201);
    let token = held.token();
    let sent = Instant::now();
    let longer = extend(app, "ext", &token, Some(json!({"ttl_ms": 20_000}))).await;
    longer.expect_status(200);
    assert_eq!(longer.fence(), held.fence());
    assert_eq!(longer.u64("limit"), 2);
    assert_lease_ms(Some(longer.u64("ttl_ms")), 20_000, sent);
    // Without a TTL: the permit's own, now 20 s.
    let sent = Instant::now();
    let own = extend(app, "ext", &token, None).await;
    own.expect_status(200);
    assert_lease_ms(Some(own.u64("ttl_ms")), 20_000, sent);
    // The token may come in the body too.
    let in_body = app
        .send_json(
            Method::PATCH,
            &path("ext"),
            &[],
            Some(json!({"token": token, "ttl_ms": 500})),
        )
        .await;
    in_body.expect_status(200);
    let listed = status(app, "ext").await.json();
    let left = listed["permits"][0]["ttl_ms"].as_u64().expect("ttl_ms");
    assert!(left <= 500, "the shorter lease is shown: {left}");
}

async fn a_caller_who_hangs_up_mid_wait_is_never_left_holding_a_permit(app: &TestApp) {
    let a = take(app, "hang", json!({"limit": 1, "ttl_ms": 10_000})).await;
    a.expect_status(201);
    let gone = spawn_take(
        app,
        "hang",
        json!({"limit": 1, "ttl_ms": 10_000, "wait_ms": 10_000}),
        Duration::from_millis(3_000),
    );
    // It waits (seen while its client still waits: 3 s, time enough for a
    // busy machine's scrape), then its client gives up, and its wait ends
    // with it.
    app.until_gauge("lockd_semaphore_waiters", &[], 1.0).await;
    assert!(gone.await.expect("task").is_err(), "the client gave up");
    app.until_gauge("lockd_semaphore_waiters", &[], 0.0).await;
    give_back(app, "hang", &a.token()).await.expect_status(204);
    // A grant made for it is given back in the background: within a few
    // seconds, well inside its 10 s lease.
    assert!(
        eventually(Duration::from_secs(5), || async {
            holders(app, "hang").await == 0
        })
        .await,
        "nobody holds a permit for the caller who left"
    );
    // A waiter whose caller leaves just as its permit frees, under a token
    // of its own: whatever the race, no permit is left but under that
    // token, the client's to give back (docs/semaphores.md: a grant made
    // after its caller left is kept under a client's token, since a retry
    // may have been answered as its holder; on a busy machine the client
    // may also give up after lockd answered 201, as after any lost
    // answer).
    for _ in 0..5 {
        let a = take(app, "race", json!({"limit": 1, "ttl_ms": 10_000})).await;
        a.expect_status(201);
        let granted_before = granted_count(app).await;
        let mine = random_token();
        let waiter = spawn_take_as(
            app,
            "race",
            &mine,
            json!({"limit": 1, "ttl_ms": 10_000, "wait_ms": 10_000}),
            Duration::from_millis(150),
        );
        tokio::time::sleep(Duration::from_millis(140)).await;
        give_back(app, "race", &a.token()).await.expect_status(204);
        let answered = waiter.await.expect("task");
        match answered {
            Ok(reply) if reply.status == 201 => {
                give_back(app, "race", &reply.token())
                    .await
                    .expect_status(204);
            }
            _ if granted_count(app).await > granted_before => {
                // lockd answered before it saw the caller leave.
                give_back(app, "race", &mine).await.expect_status(204);
            }
            _ => {
                // Given back by its token if the grant landed after the
                // caller left (204), or nothing held for it (404).
                let back = give_back(app, "race", &mine).await;
                assert!(
                    back.status == 204 || back.status == 404,
                    "{} {}",
                    back.status,
                    back.text
                );
                assert!(
                    eventually(Duration::from_secs(5), || async {
                        holders(app, "race").await == 0
                    })
                    .await,
                    "a permit is held under a token the client never had"
                );
            }
        }
    }
}

/// How many `POST /semaphores/{name}` lockd answered 201 so far.
async fn granted_count(app: &TestApp) -> u64 {
    let text = app.metrics().await;
    metric(
        &text,
        "lockd_http_requests_total",
        &[
            ("method", "POST"),
            ("route", "/semaphores/{name}"),
            ("status", "201"),
        ],
    )
    .unwrap_or(0.0) as u64
}

async fn a_wait_that_runs_out_is_full_with_when_the_earliest_permit_ends(app: &TestApp) {
    take(app, "slow", json!({"limit": 1, "ttl_ms": 10_000}))
        .await
        .expect_status(201);
    let started = Instant::now();
    let reply = take(app, "slow", json!({"limit": 1, "wait_ms": 500})).await;
    let took = started.elapsed();
    let problem = reply.expect_problem(409, "semaphore-full");
    assert!(took >= Duration::from_millis(500), "waited: {took:?}");
    let retry = problem["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!((8_000..=9_600).contains(&retry), "retry_after_ms {retry}");
    assert_eq!(reply.header("retry-after").as_deref(), Some("10"));
}

async fn a_semaphore_and_a_lock_of_one_name_are_unrelated(app: &TestApp) {
    let lock = app.acquire_ttl("shared-name", 10_000).await;
    lock.expect_status(201);
    take(app, "shared-name", json!({"limit": 1}))
        .await
        .expect_status(201);
    app.release("shared-name", &lock.token())
        .await
        .expect_status(204);
    assert_eq!(holders(app, "shared-name").await, 1);
    app.inspect("shared-name")
        .await
        .expect_problem(404, "lock-not-held");
}

async fn the_listing_never_shows_a_token(app: &TestApp) {
    let mut tokens = HashSet::new();
    for owner in ["a", "b", "c"] {
        let reply = take(app, "list", json!({"limit": 5, "owner": owner})).await;
        reply.expect_status(201);
        tokens.insert(reply.token());
    }
    let reply = status(app, "list").await;
    reply.expect_status(200);
    for token in &tokens {
        assert!(!reply.text.contains(token.as_str()), "{}", reply.text);
    }
    let body = reply.json();
    assert_eq!(body["limit"], 5);
    assert_eq!(body["holders"], 3);
    let owners: HashSet<&str> = body["permits"]
        .as_array()
        .expect("permits")
        .iter()
        .map(|p| p["owner"].as_str().expect("owner"))
        .collect();
    assert_eq!(owners, HashSet::from(["a", "b", "c"]));
    for permit in body["permits"].as_array().expect("permits") {
        for field in ["fence", "ttl_ms", "expires_at", "granted_at"] {
            assert!(!permit[field].is_null(), "{field}: {permit}");
        }
    }
}

async fn semaphore_metrics_count_grants_refusals_and_hold_time(app: &TestApp) {
    let a = take(app, "jobs:export", json!({"limit": 1})).await;
    a.expect_status(201);
    take(app, "jobs:export", json!({"limit": 1}))
        .await
        .expect_status(409);
    take(app, "jobs:export", json!({"limit": 2}))
        .await
        .expect_status(409);
    let text = app.metrics().await;
    let count = |name: &str, labels: &[(&str, &str)]| metric(&text, name, labels).unwrap_or(-1.0);
    assert_eq!(
        count(
            "lockd_semaphore_acquire_total",
            &[("namespace", "jobs"), ("result", "acquired")]
        ),
        1.0
    );
    assert_eq!(
        count(
            "lockd_semaphore_acquire_total",
            &[("namespace", "jobs"), ("result", "full")]
        ),
        1.0
    );
    assert_eq!(
        count(
            "lockd_semaphore_acquire_total",
            &[("namespace", "jobs"), ("result", "limit_mismatch")]
        ),
        1.0
    );
    assert_eq!(
        count("lockd_semaphore_permits_held", &[("namespace", "jobs")]),
        1.0
    );
    give_back(app, "jobs:export", &a.token())
        .await
        .expect_status(204);
    give_back(app, "jobs:export", &a.token())
        .await
        .expect_status(404);
    let text = app.metrics().await;
    let count = |name: &str, labels: &[(&str, &str)]| metric(&text, name, labels).unwrap_or(-1.0);
    assert_eq!(
        count(
            "lockd_semaphore_release_total",
            &[("namespace", "jobs"), ("result", "released")]
        ),
        1.0
    );
    assert_eq!(
        count(
            "lockd_semaphore_permit_expired_total",
            &[("namespace", "jobs")]
        ),
        1.0
    );
    assert_eq!(
        count(
            "lockd_semaphore_hold_seconds_count",
            &[("namespace", "jobs")]
        ),
        1.0
    );
    assert_eq!(
        count("lockd_semaphore_permits_held", &[("namespace", "jobs")]),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_waiters_are_in_the_metrics() {
    let app = TestApp::redis().await;
    take(&app, "q:one", json!({"limit": 1}))
        .await
        .expect_status(201);
    let waiter = spawn_take(
        &app,
        "q:one",
        json!({"limit": 1, "wait_ms": 3_000}),
        Duration::from_secs(10),
    );
    let mut seen = 0.0;
    for _ in 0..50 {
        let text = app.metrics().await;
        seen = metric(&text, "lockd_semaphore_waiters", &[("namespace", "q")]).unwrap_or(0.0);
        if seen == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen, 1.0, "one waiter shown");
    let text = app.metrics().await;
    assert_eq!(
        metric(&text, "lockd_waiters", &[("namespace", "q")]),
        Some(0.0),
        "a permit's waiter is not a lock's"
    );
    waiter
        .await
        .expect("task")
        .expect("answer")
        .expect_status(409);
}

/// C21: holders live in Redis, not in lockd: a new lockd sees A's permit,
/// refuses B, and lets A extend and give it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c21_semaphore_restart_holders_survive_a_lockd_restart() {
    let first = TestApp::redis().await;
    let a = take(
        &first,
        "one",
        json!({"limit": 1, "ttl_ms": 20_000, "owner": "A"}),
    )
    .await;
    a.expect_status(201);
    let restarted = first.sibling(|_| {}).await;
    first.shut_down();
    assert!(first.stopped_within(Duration::from_secs(10)).await);
    drop(first);
    take(&restarted, "one", json!({"limit": 1}))
        .await
        .expect_problem(409, "semaphore-full");
    let listed = status(&restarted, "one").await;
    listed.expect_status(200);
    assert_eq!(listed.json()["permits"][0]["owner"], "A");
    assert_eq!(listed.json()["permits"][0]["fence"], a.fence());
    extend(
        &restarted,
        "one",
        &a.token(),
        Some(json!({"ttl_ms": 30_000})),
    )
    .await
    .expect_status(200);
    give_back(&restarted, "one", &a.token())
        .await
        .expect_status(204);
    take(&restarted, "one", json!({"limit": 1}))
        .await
        .expect_status(201);
}

/// A permit given back through one instance wakes a waiter on another, at
/// once (release events cross instances through Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_on_one_instance_wakes_a_waiter_on_another() {
    let one = TestApp::redis().await;
    let two = one.sibling(|_| {}).await;
    let a = take(&one, "x", json!({"limit": 1, "ttl_ms": 30_000})).await;
    a.expect_status(201);
    let waiter = spawn_take(
        &two,
        "x",
        json!({"limit": 1, "wait_ms": 20_000}),
        Duration::from_secs(30),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    give_back(&one, "x", &a.token()).await.expect_status(204);
    waiter
        .await
        .expect("task")
        .expect("answer")
        .expect_status(201);
    let took = released.elapsed();
    assert!(took < Duration::from_secs(2), "woken after {took:?}");
}

/// Redlock cannot keep a semaphore's limit (three clients can each win two
/// of three nodes), so every semaphore route answers 501 and writes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_in_redlock_mode_are_501_and_write_nothing() {
    let app = TestApp::redlock_conformance(|_| {}).await;
    let token = random_token();
    for (method, body) in [
        (Method::POST, Some(json!({"limit": 2}))),
        (Method::POST, Some(json!({"limit": 2, "wait_ms": 1_000}))),
        (Method::PATCH, None),
        (Method::DELETE, None),
        (Method::GET, None),
    ] {
        let headers: &[(&str, &str)] = if method == Method::GET {
            &[]
        } else {
            &[("Lock-Token", token.as_str())]
        };
        let reply = app
            .send_json(method.clone(), &path("pool"), headers, body)
            .await;
        let problem = reply.expect_problem(501, "not-implemented");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("Redlock")),
            "{method}: {}",
            reply.text
        );
    }
    assert_eq!(app.lock_key_count().await, 0);
    // Bad input is still 400 first.
    take(&app, "pool", json!({"limit": 0}))
        .await
        .expect_problem(400, "invalid-request");
}

/// C19 and C20 on a Redis Cluster: every key of a semaphore in one slot,
/// the limit held, and waiters woken by sharded release events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c19_semaphore_atomic_never_more_than_the_limit_on_a_cluster() {
    let app = TestApp::cluster_on(shared_cluster(), |_| {}).await;
    let name = format!("sem-{}", &random_token()[..8]);
    never_more_than_the_limit(&app, &name).await;
    let chain = format!("chain-{}", &random_token()[..8]);
    let a = take(&app, &chain, json!({"limit": 1, "ttl_ms": 30_000})).await;
    a.expect_status(201);
    let waiter = spawn_take(
        &app,
        &chain,
        json!({"limit": 1, "wait_ms": 20_000}),
        Duration::from_secs(30),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    give_back(&app, &chain, &a.token()).await.expect_status(204);
    waiter
        .await
        .expect("task")
        .expect("answer")
        .expect_status(201);
    let took = released.elapsed();
    assert!(took < Duration::from_secs(2), "woken after {took:?}");
}

/// Waits until `name` has no permit, up to `within`.
async fn freed_within(app: &TestApp, name: &str, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if holders(app, name).await == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Holds back Redis's writes for `ms` (`CLIENT PAUSE ... WRITE`), after a
/// first permit request has loaded the scripts and opened a connection.
async fn pause_writes(app: &TestApp, ms: u64) {
    let warm = take(app, "warm-up", json!({"limit": 1})).await;
    warm.expect_status(201);
    give_back(app, "warm-up", &warm.token())
        .await
        .expect_status(204);
    let _: () = app
        .redis_server()
        .cmd(::redis::cmd("CLIENT").arg("PAUSE").arg(ms).arg("WRITE"))
        .await;
}

/// C08 for permits: the take script waits in a paused Redis past lockd's
/// Redis timeout (503), then runs and grants a permit nobody received;
/// lockd gives it back once Redis answers (on the same connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_after_a_redis_timeout_leaves_no_permit_behind() {
    let app = TestApp::redis_with(|s| s.store.redis_timeout = Duration::from_millis(300)).await;
    pause_writes(&app, 800).await;
    take(&app, "c08", json!({"limit": 1, "ttl_ms": 10_000}))
        .await
        .expect_problem(503, "backend-unavailable");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        freed_within(&app, "c08", Duration::from_secs(2)).await,
        "a permit stayed for a token no client received"
    );
}

/// The request's own time runs out while the take script waits in a
/// paused Redis (the Redis timeout is longer): the handler answers 503
/// `timeout`, the script goes on and grants, and that permit, granted
/// after its caller left, is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_granted_after_the_request_timed_out_is_given_back() {
    let app = TestApp::redis_with(|s| {
        s.store.redis_timeout = Duration::from_millis(3_000);
        s.limits.request_timeout = Duration::from_millis(200);
    })
    .await;
    pause_writes(&app, 700).await;
    take(&app, "late", json!({"limit": 1, "ttl_ms": 10_000}))
        .await
        .expect_problem(503, "timeout");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        freed_within(&app, "late", Duration::from_secs(2)).await,
        "a permit stayed for a caller who was answered 503"
    );
}

/// A request naming another limit is refused at once with limit-mismatch,
/// even when it would queue behind a waiter (which it can never follow).
async fn a_queued_request_with_another_limit_is_refused_at_once(app: &TestApp) {
    take(app, "q", json!({"limit": 1, "ttl_ms": 30_000}))
        .await
        .expect_status(201);
    let waiter = spawn_take(
        app,
        "q",
        json!({"limit": 1, "wait_ms": 3_000}),
        Duration::from_secs(10),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let reply = take(app, "q", json!({"limit": 2, "wait_ms": 2_000})).await;
    let problem = reply.expect_problem(409, "limit-mismatch");
    assert_eq!(problem["limit"], 1, "{}", reply.text);
    assert!(
        started.elapsed() < Duration::from_millis(1_000),
        "refused after {:?}",
        started.elapsed()
    );
    waiter
        .await
        .expect("task")
        .expect("answer")
        .expect_problem(409, "semaphore-full");
}

/// A holder's retry (same token, with wait_ms) queued behind another
/// waiter renews its permit at once: 200, the same fence.
async fn a_holders_retry_queued_behind_a_waiter_renews_at_once(app: &TestApp) {
    let token = random_token();
    let held = take_as(app, "r", &token, json!({"limit": 1, "ttl_ms": 30_000})).await;
    held.expect_status(201);
    let waiter = spawn_take(
        app,
        "r",
        json!({"limit": 1, "wait_ms": 3_000}),
        Duration::from_secs(10),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let again = take_as(
        app,
        "r",
        &token,
        json!({"limit": 1, "ttl_ms": 40_000, "wait_ms": 2_000}),
    )
    .await;
    again.expect_status(200);
    assert_eq!(again.fence(), held.fence());
    assert_lease_ms(Some(again.u64("ttl_ms")), 40_000, started);
    assert!(
        started.elapsed() < Duration::from_millis(1_000),
        "renewed after {:?}",
        started.elapsed()
    );
    assert_eq!(holders(app, "r").await, 1);
    waiter
        .await
        .expect("task")
        .expect("answer")
        .expect_problem(409, "semaphore-full");
}

/// A permit is the holder's for at least its `ttl_ms` from the moment the
/// holder sent its request: another client polling for it is never granted
/// it earlier (a clock in whole milliseconds let it run out up to 1 ms
/// early). 60 rounds of a 20 ms permit, the second client polling. On a
/// busy machine a 20 ms permit may run out before its answer arrives: a
/// 503 that says so, a round with nothing to check, and another is run
/// (at most 600 in all).
async fn a_permit_never_runs_out_before_its_ttl(app: &TestApp) {
    const TTL: Duration = Duration::from_millis(20);
    let mut early = Vec::new();
    let mut checked = 0;
    for round in 0..600 {
        if checked == 60 {
            break;
        }
        let name = format!("edge-{round}");
        let sent = Instant::now();
        let first = take(app, &name, json!({"limit": 1, "ttl_ms": TTL.as_millis()})).await;
        if first.status == 503 {
            let problem = first.expect_problem(503, "backend-unavailable");
            let detail = problem["detail"].as_str().unwrap_or("");
            assert!(detail.contains("ran out before"), "{problem}");
            continue;
        }
        first.expect_status(201);
        checked += 1;
        let granted = loop {
            let reply = take(app, &name, json!({"limit": 1, "ttl_ms": 1_000})).await;
            if reply.status == 201 {
                break Instant::now();
            }
            reply.expect_status(409);
        };
        if granted < sent + TTL {
            early.push(sent + TTL - granted);
        }
    }
    assert!(
        early.is_empty(),
        "granted to another before the lease could end, by {early:?}"
    );
    assert!(checked > 0, "every 20 ms permit ran out before its answer");
}
