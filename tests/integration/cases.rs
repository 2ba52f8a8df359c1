//! The field cases C01 to C07 (docs/field-cases.md): faults reported
//! against other Redis-based locks (a lease that expires under its holder,
//! absurd TTLs, Redis's script cache, guessable or shared tokens), each
//! replayed over HTTP against lockd.
//! Every case runs against both backends (`redis::cNN_*` and
//! `memory::cNN_*`), except C05, which is about Redis's script cache.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use crate::support::{
    Reply, TestApp, assert_lease_ms, assert_pttl_since, backend_tests, ms_since, ms_until,
    random_token,
};
use futures::future::join_all;
use lockd::cli::ServeArgs;
use lockd::config::Settings;
use lockd::lock::Ttl;
use reqwest::Method;
use serde_json::json;

backend_tests!(
    c01_extend_after_expiry_fails,
    c02_late_release_keeps_new_holder,
    c02_stress_late_releases_never_delete_the_next_grant,
    c03_extend_with_zero_or_negative_ttl_keeps_the_lock,
    c03_absurd_ttls_are_refused_before_the_store_is_touched,
    c04_ttl_milliseconds_stay_milliseconds,
    c04_tiny_ttls_are_neither_zero_nor_a_second,
    c04_every_duration_field_names_its_unit,
    c06_non_owner_and_missing_locks_get_distinct_answers,
    c07_concurrent_tokens_are_distinct_with_128_random_bits,
    c07_concurrent_acquires_of_one_name_grant_exactly_one,
    c07_token_of_one_lock_cannot_touch_another,
);

// ---------------------------------------------------------------------------
// C01 expiry-race: extend after expiry must fail
// ---------------------------------------------------------------------------

async fn c01_extend_after_expiry_fails(app: &TestApp) {
    let name = "orders:1";
    let a = app.acquire_ttl(name, 100).await;
    a.expect_status(201);
    let tok_a = a.token();
    tokio::time::sleep(Duration::from_millis(150)).await;

    let b = app.acquire_ttl(name, 30_000).await;
    b.expect_status(201);
    let tok_b = b.token();

    app.extend_ttl(name, &tok_a, 5000)
        .await
        .expect_problem(409, "not-lock-owner");
    let (holder, pttl) = app.holder(name).await.expect("B still holds");
    assert_eq!(holder, tok_b, "A's extend changed the holder");
    assert!(pttl <= 30_000, "PTTL {pttl}");

    app.release(name, &tok_b).await.expect_status(204);
    app.extend_ttl(name, &tok_a, 5000)
        .await
        .expect_problem(404, "lock-not-held");
    assert_eq!(app.holder(name).await, None, "extend created the lock");
    assert_eq!(app.lock_key_count().await, 0, "extend wrote a key");
    app.inspect(name).await.expect_problem(404, "lock-not-held");
}

// ---------------------------------------------------------------------------
// C02 expiry-race: a late release must not delete the next holder's lock
// ---------------------------------------------------------------------------

async fn c02_late_release_keeps_new_holder(app: &TestApp) {
    let name = "jobs";
    let a = app.acquire_ttl(name, 100).await;
    a.expect_status(201);
    let (tok_a, fence_a) = (a.token(), a.fence());
    tokio::time::sleep(Duration::from_millis(150)).await;

    let b = app.acquire_ttl(name, 30_000).await;
    b.expect_status(201);
    let (tok_b, fence_b) = (b.token(), b.fence());
    assert!(fence_b > fence_a, "fence went from {fence_a} to {fence_b}");
    let (_, pttl_before) = app.holder(name).await.expect("B holds");

    app.release(name, &tok_a)
        .await
        .expect_problem(409, "not-lock-owner");
    let (holder, pttl_after) = app.holder(name).await.expect("B still holds");
    assert_eq!(holder, tok_b);
    assert!(
        pttl_after <= pttl_before,
        "A's release touched B's lease: {pttl_before} -> {pttl_after}"
    );
    let status = app.inspect(name).await;
    status.expect_status(200);
    assert_eq!(status.fence(), fence_b);

    let c = app.acquire_ttl(name, 30_000).await;
    let problem = c.expect_problem(409, "lock-held");
    assert!(problem["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0));
    assert_eq!(app.holder_token(name).await, Some(tok_b.clone()));

    app.release(name, &tok_b).await.expect_status(204);
    assert_eq!(app.holder(name).await, None);
}

/// A holds `jobs:stress` for 5 to 10 ms (longer on a machine too slow to
/// grant so short a lease); its release is sent from 2 ms before to 3 ms
/// after the lease ends, while B hammers the lock with
/// acquires. In every round B's lock must survive A's release, B's grant
/// must not come before A's lease ended unless A released in time, and
/// fences must grow.
async fn c02_stress_late_releases_never_delete_the_next_grant(app: &TestApp) {
    const ROUNDS: u64 = 1000;
    let name = "jobs:stress";
    let (mut in_time, mut late) = (0u32, 0u32);
    let mut last_fence = 0;
    let started = Instant::now();
    for round in 0..ROUNDS {
        // Enough rounds, on a machine slow enough that they take long: the
        // property is checked in each, and at least 50 of them ran.
        if round >= 50 && started.elapsed() > Duration::from_secs(60) {
            break;
        }
        let mut ttl = 5 + round % 6;
        // A lease of a few ms can be over before its answer arrives on a
        // loaded machine (with Redlock, before the quorum's answers, less
        // the drift): then it is deleted and answered 503, never 409, since
        // nobody else holds it. Try again with a longer lease: the race is
        // the same at any length.
        let (a_sent, a) = loop {
            let a_sent = Instant::now();
            let a = app.acquire_ttl(name, ttl).await;
            if a.status != 503 {
                break (a_sent, a);
            }
            a.expect_problem(503, "backend-unavailable");
            ttl = (ttl + 5).min(1000);
        };
        a.expect_status(201);
        let (tok_a, fence_a) = (a.token(), a.fence());
        assert!(fence_a > last_fence, "round {round}: fence went backwards");

        let a_delay = Duration::from_millis(ttl - 2 + round % 6);
        let a_side = async {
            tokio::time::sleep_until((a_sent + a_delay).into()).await;
            let sent = Instant::now();
            (sent, app.release(name, &tok_a).await)
        };
        let b_side = async {
            loop {
                let b = app.acquire_ttl(name, 30_000).await;
                match b.status.as_u16() {
                    201 => return (Instant::now(), b),
                    409 => {}
                    other => panic!("round {round}: B's acquire got {other}: {}", b.text),
                }
            }
        };
        let ((release_sent, release), (b_granted, b)) = tokio::join!(a_side, b_side);
        let (tok_b, fence_b) = (b.token(), b.fence());
        assert!(fence_b > fence_a, "round {round}: fence did not grow");
        last_fence = fence_b;

        match release.status.as_u16() {
            204 => {
                in_time += 1;
                assert!(
                    b_granted >= release_sent,
                    "round {round}: B was granted before A released, yet A's release succeeded"
                );
            }
            404 | 409 => {
                late += 1;
                assert!(
                    b_granted.duration_since(a_sent) >= Duration::from_millis(ttl),
                    "round {round}: B was granted {:?} after A's {ttl} ms grant was asked for, \
                     and A never released",
                    b_granted.duration_since(a_sent)
                );
            }
            other => panic!("round {round}: A's release got {other}: {}", release.text),
        }
        assert_eq!(
            app.holder_token(name).await,
            Some(tok_b.clone()),
            "round {round}: A's late release ({}) removed B's lock",
            release.status
        );
        app.release(name, &tok_b).await.expect_status(204);
    }
    eprintln!(
        "c02 stress: {} rounds in {:?}; A released in time {in_time}x, late {late}x",
        in_time + late,
        started.elapsed()
    );
    assert!(
        in_time > 0 && late > 0,
        "the race was not exercised: in time {in_time}, late {late}"
    );
}

// ---------------------------------------------------------------------------
// C03 input-validation: zero, negative and absurd TTLs
// ---------------------------------------------------------------------------

/// What the store looks like, to compare before and after refused requests.
#[derive(Debug, PartialEq)]
struct Snapshot {
    lock_keys: usize,
    all_keys: Option<Vec<String>>,
    backend_calls: u64,
}

async fn snapshot(app: &TestApp) -> Snapshot {
    Snapshot {
        lock_keys: app.lock_key_count().await,
        all_keys: match app.is_redis() {
            true => Some(app.redis_server().keys().await),
            false => None,
        },
        backend_calls: app.backend_calls().await,
    }
}

async fn c03_extend_with_zero_or_negative_ttl_keeps_the_lock(app: &TestApp) {
    let name = "c03:k";
    let a = app.acquire_ttl(name, 10_000).await;
    a.expect_status(201);
    let tok_a = a.token();
    let (_, pttl_before) = app.holder(name).await.expect("A holds");
    let read_before = Instant::now();
    let before = snapshot(app).await;

    for body in [json!({ "ttl_ms": 0 }), json!({ "ttl_ms": -1000 })] {
        app.extend(name, &tok_a, Some(body))
            .await
            .expect_problem(400, "invalid-request");
    }
    for query in ["ttl_ms=0", "ttl_ms=-1000"] {
        app.send(
            Method::PATCH,
            &format!("/locks/{name}?{query}"),
            &[("Lock-Token", &tok_a)],
            None,
        )
        .await
        .expect_problem(400, "invalid-request");
    }

    let (holder, pttl_after) = app.holder(name).await.expect("the lock was deleted");
    // Neither reset nor cut short: it lost no more than the time between
    // the two reads.
    let between = ms_since(read_before);
    assert_eq!(holder, tok_a);
    assert!(
        pttl_after <= pttl_before && pttl_after + between + 50 >= pttl_before,
        "PTTL went from {pttl_before} to {pttl_after} in {between} ms"
    );
    assert_eq!(snapshot(app).await, before);
}

/// Bodies and query strings carrying a TTL that is not an integer number of
/// milliseconds in 1..=3600000.
const BAD_JSON_TTLS: &[&str] = &[
    "0",
    "-5",
    "-1000",
    "1.5",
    "1500.0",
    "1e3",
    "\"1500\"",
    "9223372036854775808",
    "18446744073709551616",
    "3600001",
    "[1]",
    "{}",
    "true",
];
const BAD_QUERY_TTLS: &[&str] = &[
    "0",
    "-5",
    "1.5",
    "1e3",
    "%221500%22",
    "9223372036854775808",
    "3600001",
    "%5B1%5D",
    "",
    "abc",
];

async fn c03_absurd_ttls_are_refused_before_the_store_is_touched(app: &TestApp) {
    let (held, free) = ("c03:held", "c03:free");
    let a = app.acquire_ttl(held, 10_000).await;
    a.expect_status(201);
    let tok_a = a.token();
    let (_, pttl_before) = app.holder(held).await.expect("A holds");
    let read_before = Instant::now();
    let before = snapshot(app).await;
    if app.is_redis() {
        app.redis_server().reset_stats().await;
    }

    let mut refused = 0;
    for ttl in BAD_JSON_TTLS {
        let requests = [
            // A fresh lock: a refused acquire must write nothing.
            (Method::POST, free, None, format!(r#"{{"ttl_ms":{ttl}}}"#)),
            // A's own lock with A's token: accepted, it would reset A's TTL.
            (
                Method::POST,
                held,
                None,
                format!(r#"{{"ttl_ms":{ttl},"token":"{tok_a}"}}"#),
            ),
            (
                Method::PATCH,
                held,
                Some(tok_a.as_str()),
                format!(r#"{{"ttl_ms":{ttl}}}"#),
            ),
        ];
        for (method, name, token, body) in requests {
            let mut headers = vec![("Content-Type", "application/json")];
            headers.extend(token.map(|t| ("Lock-Token", t)));
            let reply = app
                .send(
                    method.clone(),
                    &format!("/locks/{name}"),
                    &headers,
                    Some(body.clone().into_bytes()),
                )
                .await;
            assert_eq!(
                reply.status, 400,
                "{method} {name} {body} -> {}",
                reply.text
            );
            reply.expect_problem(400, "invalid-request");
            refused += 1;
        }
    }
    for ttl in BAD_QUERY_TTLS {
        for (method, name, token) in [
            (Method::POST, free, None),
            (Method::PATCH, held, Some(tok_a.as_str())),
        ] {
            let headers: Vec<_> = token.map(|t| ("Lock-Token", t)).into_iter().collect();
            let path = format!("/locks/{name}?ttl_ms={ttl}");
            let reply = app.send(method.clone(), &path, &headers, None).await;
            assert_eq!(reply.status, 400, "{method} {path} -> {}", reply.text);
            reply.expect_problem(400, "invalid-request");
            refused += 1;
        }
    }
    assert!(refused > 50);

    if app.is_redis() {
        assert_eq!(
            app.redis_server().script_calls().await,
            0,
            "a refused request ran a script in Redis"
        );
    }
    assert_eq!(snapshot(app).await, before, "a refused request wrote");
    assert_eq!(app.holder(free).await, None);
    let (holder, pttl_after) = app.holder(held).await.expect("A's lock is gone");
    // Neither reset nor cut short: it lost no more than the time between
    // the two reads (a few ms more for Redlock's nodes, read one by one).
    let between = ms_since(read_before);
    assert_eq!(holder, tok_a);
    assert!(
        pttl_after <= pttl_before && pttl_after + between + 50 >= pttl_before,
        "A's PTTL went from {pttl_before} to {pttl_after} in {between} ms"
    );
}

/// C03 must hold whatever `max_ttl_ms` the operator sets. A setting above
/// `Ttl::CEILING_MS` (365 days) is refused at start-up; at the ceiling,
/// TTLs that neither Redis (`PX` above `i64::MAX`) nor an RFC 3339
/// `expires_at` (after 9999-12-31) can represent get an answer, never a 5xx,
/// and 2^63 and above are refused with 400 with nothing written.
async fn c03_huge_max_ttl_setting_still_refuses_absurd_ttls(app: &TestApp) {
    let held = app.acquire_ttl("c03:huge:held", 10_000).await;
    held.expect_status(201);
    let tok = held.token();
    let before = snapshot(app).await;
    let mut failures = Vec::new();
    for (ttl, must_refuse) in [
        (u128::from(u64::MAX) + 1, true),
        (u128::from(u64::MAX), true),
        (1u128 << 63, true),
        (1u128 << 62, false),
        (10u128.pow(15), false),
    ] {
        let body = format!(r#"{{"ttl_ms":{ttl}}}"#).into_bytes();
        let json = [("Content-Type", "application/json")];
        let extend = [("Content-Type", "application/json"), ("Lock-Token", &tok)];
        for (method, path, headers) in [
            (Method::POST, "/locks/c03:huge:free", &json[..]),
            (Method::PATCH, "/locks/c03:huge:held", &extend[..]),
        ] {
            let what = format!("{method} {path} ttl_ms={ttl}");
            match app
                .try_send(method, path, headers, Some(body.clone()))
                .await
            {
                Err(e) => failures.push(format!("{what}: no HTTP answer ({e})")),
                Ok(r) if r.status.is_server_error() => {
                    failures.push(format!("{what}: {} {}", r.status, r.text));
                }
                Ok(r) if must_refuse && r.status != 400 => {
                    failures.push(format!("{what}: {} instead of 400", r.status));
                }
                Ok(_) => {}
            }
        }
    }
    let written = app.holder("c03:huge:free").await;
    assert!(
        failures.is_empty(),
        "with max_ttl_ms = u64::MAX:\n{}\nc03:huge:free is now held: {}",
        failures.join("\n"),
        written.is_some()
    );
    if written.is_none() {
        assert_eq!(snapshot(app).await.lock_keys, before.lock_keys);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c03_largest_max_ttl_setting_still_refuses_absurd_ttls_on_redis() {
    let app = TestApp::redis_with(|s| s.limits.max_ttl = Ttl::MAX).await;
    c03_huge_max_ttl_setting_still_refuses_absurd_ttls(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c03_largest_max_ttl_setting_still_refuses_absurd_ttls_on_memory() {
    let app = TestApp::memory_with(|s| s.limits.max_ttl = Ttl::MAX).await;
    c03_huge_max_ttl_setting_still_refuses_absurd_ttls(&app).await;
}

#[test]
fn c03_a_max_ttl_setting_above_the_ceiling_is_refused_at_start_up() {
    let args = ServeArgs {
        listen: Some("127.0.0.1:0".parse().expect("address")),
        max_ttl_ms: Some(Ttl::CEILING_MS + 1),
        dev: Some(true),
        ..ServeArgs::default()
    };
    let loaded = Settings::load(&args);
    assert!(loaded.is_err(), "max_ttl_ms above 365 days must be refused");
}

// ---------------------------------------------------------------------------
// C04 ttl-units: milliseconds stay milliseconds
// ---------------------------------------------------------------------------

async fn c04_ttl_milliseconds_stay_milliseconds(app: &TestApp) {
    let name = "c04:ms";
    let sent = Instant::now();
    let a = app.acquire_ttl(name, 1500).await;
    // The lease was granted before this: it ends by 1500 ms from here.
    let answered = Instant::now();
    a.expect_status(201);
    let (_, pttl) = app.holder(name).await.expect("A holds");
    // Every bound below is what is left of 1500 ms after the time measured
    // since the send (and, with Redlock, its clock-drift allowance), so
    // that a slow machine cannot fail it and a unit error (seconds, or
    // microseconds) always does.
    let since = || ms_since(sent);
    let elapsed = since();
    let drift = if app.is_redlock() {
        (1500.0 * app.settings.store.drift_factor) as i64 + 2
    } else {
        0
    };
    let ttl_ms = i64::try_from(a.u64("ttl_ms")).expect("fits");
    assert!(
        ttl_ms <= 1500 && ttl_ms >= 1500 - elapsed - drift,
        "ttl_ms {ttl_ms} for a lease of 1500 ms, {elapsed} ms after the send"
    );
    assert!(pttl <= 1500, "PTTL {pttl} for ttl 1500");
    assert!(
        1500 - pttl <= elapsed + 3,
        "ttl_ms 1500 and PTTL {pttl} differ by more than the {elapsed} ms elapsed"
    );
    let expires_in = ms_until(&a.str("expires_at"));
    // Redlock counts its validity from the send, less the round trip and
    // the drift allowance: its expires_at errs early by both.
    let early = if app.is_redlock() { since() + drift } else { 0 };
    assert!(
        expires_in <= 1500 && expires_in >= 1500 - since() - early - 20,
        "expires_at is {expires_in} ms away"
    );

    // lockd counts a read's whole round trip against the PTTL it read (the
    // answer errs early), so each bound allows that round trip once more.
    let asked = Instant::now();
    let status = app.inspect(name).await;
    let took = ms_since(asked);
    status.expect_status(200);
    let shown = i64::try_from(status.u64("ttl_ms")).expect("fits");
    assert!(
        shown <= 1500 && shown >= 1500 - since() - took - 3,
        "GET ttl_ms {shown}, {} ms after the send, the GET taking {took} ms",
        since()
    );

    let asked = Instant::now();
    let b = app.acquire_ttl(name, 1500).await;
    let took = ms_since(asked);
    let problem = b.expect_problem(409, "lock-held");
    let retry = problem["retry_after_ms"].as_u64().expect("retry_after_ms");
    let retry = i64::try_from(retry).expect("fits");
    assert!(
        retry <= 1500 && retry >= 1500 - since() - took - 3,
        "retry_after_ms {retry}, {} ms after the send, the request taking {took} ms",
        since()
    );
    assert_eq!(b.header("retry-after").as_deref(), Some("2"));

    // Held past a second (granted after `sent`, it ends 1500 ms after
    // that at the earliest; 400 ms to spare for this request), and free
    // once 1500 ms have passed since the answer.
    tokio::time::sleep_until((sent + Duration::from_millis(1100)).into()).await;
    app.acquire_ttl(name, 1500)
        .await
        .expect_problem(409, "lock-held");
    tokio::time::sleep_until((answered + Duration::from_millis(1530)).into()).await;
    app.acquire_ttl(name, 1500).await.expect_status(201);
}

async fn c04_tiny_ttls_are_neither_zero_nor_a_second(app: &TestApp) {
    // ttl 1: granted (not refused as 0), and free again well before a second.
    // A 1 ms lease may be over before its answer arrives; it is then not
    // answered as a lease (503, and deleted), never stretched.
    // Redlock's validity, ttl − elapsed − 2 ms, is never positive for
    // 1 ms: the same 503, nothing held (not 409: nobody else holds it).
    let one = app.acquire_ttl("c04:one", 1).await;
    if one.status == 201 && !app.is_redlock() {
        assert_eq!(one.u64("ttl_ms"), 1);
    } else {
        let problem = one.expect_problem(503, "backend-unavailable");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("nothing is held")),
            "{}",
            one.text
        );
    }
    if let Some((_, pttl)) = app.holder("c04:one").await {
        assert!(pttl <= 1, "PTTL {pttl} for ttl 1");
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(app.holder("c04:one").await, None);
    app.acquire_ttl("c04:one", 1000).await.expect_status(201);

    // ttl 999: not 1000, not 0.
    // Bounds are what is left of 999 ms after the time measured since the
    // send, so that a slow machine cannot fail them.
    let sent = Instant::now();
    let since = || ms_since(sent);
    let a = app.acquire_ttl("c04:999", 999).await;
    let answered = Instant::now();
    a.expect_status(201);
    assert_lease_ms(Some(a.u64("ttl_ms")), 999, sent);
    let (_, pttl) = app.holder("c04:999").await.expect("held");
    assert!(
        pttl + since() + 1 >= 999 && pttl <= 999,
        "PTTL {pttl} for ttl 999"
    );
    let b = app.acquire_ttl("c04:999", 999).await;
    let problem = b.expect_problem(409, "lock-held");
    let retry = problem["retry_after_ms"].as_u64().expect("retry_after_ms");
    let retry = i64::try_from(retry).expect("fits");
    assert!(
        retry + since() + 1 >= 999 && retry <= 999,
        "retry_after_ms {retry}"
    );
    assert_eq!(b.header("retry-after").as_deref(), Some("1"));
    tokio::time::sleep_until((answered + Duration::from_millis(1030)).into()).await;
    app.acquire_ttl("c04:999", 999).await.expect_status(201);
}

/// Every numeric member of every answer is a fence, a status, or a duration
/// whose name ends in `_ms`; the sets of members are exactly the documented
/// ones.
async fn c04_every_duration_field_names_its_unit(app: &TestApp) {
    fn members(reply: &Reply) -> BTreeSet<String> {
        let body = reply.json();
        let object = body.as_object().expect("a JSON object");
        for (key, value) in object {
            // A fence, a status and a count of holders are not durations.
            let unitless = key == "fence" || key == "status" || key.ends_with("_count");
            if value.is_number() && !unitless {
                assert!(key.ends_with("_ms"), "`{key}` has no unit: {}", reply.text);
            }
        }
        object.keys().cloned().collect()
    }
    fn set(keys: &[&str]) -> BTreeSet<String> {
        keys.iter().map(|k| (*k).to_owned()).collect()
    }
    let name = "c04:units";
    let grant = app
        .acquire(name, Some(json!({ "ttl_ms": 5000, "owner": "w" })))
        .await;
    grant.expect_status(201);
    assert_eq!(
        members(&grant),
        set(&["name", "token", "mode", "fence", "ttl_ms", "expires_at"])
    );
    let sent = Instant::now();
    let token = grant.token();
    let extended = app.extend_ttl(name, &token, 6000).await;
    extended.expect_status(200);
    assert_lease_ms(Some(extended.u64("ttl_ms")), 6000, sent);
    assert_eq!(
        members(&extended),
        set(&["name", "fence", "ttl_ms", "expires_at"])
    );
    let status = app.inspect(name).await;
    status.expect_status(200);
    assert_eq!(
        members(&status),
        set(&[
            "name",
            "held",
            "fence",
            "ttl_ms",
            "expires_at",
            "owner",
            "meta",
            "granted_at",
            "mode",
            "holder_count",
            "holders",
            "writer_waiting"
        ])
    );
    let held = app.acquire_ttl(name, 5000).await;
    held.expect_problem(409, "lock-held");
    assert_eq!(
        members(&held),
        set(&[
            "type",
            "title",
            "status",
            "detail",
            "retry_after_ms",
            "request_id"
        ])
    );
}

// ---------------------------------------------------------------------------
// C05 script-cache: NOSCRIPT after restart or SCRIPT FLUSH (Redis only)
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_script_flush_is_transparent() {
    let app = TestApp::redis().await;
    let redis = app.redis_server();
    let a = app.acquire_ttl("k", 30_000).await;
    a.expect_status(201);
    let tok_a = a.token();

    let _: () = redis.cmd(::redis::cmd("SCRIPT").arg("FLUSH")).await;
    let loaded: Vec<bool> = redis
        .cmd(::redis::cmd("SCRIPT").arg("EXISTS").arg("0000"))
        .await;
    assert_eq!(loaded, [false]);

    let sent = Instant::now();
    let extended = app.extend_ttl("k", &tok_a, 20_000).await;
    extended.expect_status(200);
    assert_eq!(extended.fence(), a.fence());
    let (_, pttl) = app.holder("k").await.expect("A holds");
    assert_pttl_since(pttl, 20_000, sent);

    let _: () = redis.cmd(::redis::cmd("SCRIPT").arg("FLUSH")).await;
    app.inspect("k").await.expect_status(200);
    let _: () = redis.cmd(::redis::cmd("SCRIPT").arg("FLUSH")).await;
    app.release("k", &tok_a).await.expect_status(204);
    assert_eq!(app.holder("k").await, None);

    let _: () = redis.cmd(::redis::cmd("SCRIPT").arg("FLUSH")).await;
    let b = app.acquire_ttl("k2", 30_000).await;
    b.expect_status(201);
    app.release("k2", &b.token()).await.expect_status(204);
    assert_eq!(app.lock_key_count().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_redis_restart_reloads_scripts_and_a_lost_lock_is_404() {
    let app = TestApp::redis().await;
    let redis = app.redis_server();
    let a = app.acquire_ttl("k", 30_000).await;
    a.expect_status(201);
    let tok_a = a.token();

    redis.stop();
    redis.start().await;
    assert_eq!(
        redis.keys().await,
        Vec::<String>::new(),
        "no persistence expected"
    );

    // The pool's connections broke and the script cache is empty: neither
    // may show as a 5xx. A's lock was lost with Redis's memory.
    app.extend_ttl("k", &tok_a, 20_000)
        .await
        .expect_problem(404, "lock-not-held");
    app.release("k", &tok_a)
        .await
        .expect_problem(404, "lock-not-held");
    let b = app.acquire_ttl("k2", 30_000).await;
    b.expect_status(201);
    assert_eq!(app.holder_token("k2").await, Some(b.token()));
    app.release("k2", &b.token()).await.expect_status(204);
    assert_eq!(app.lock_key_count().await, 0);
}

// ---------------------------------------------------------------------------
// C06 ownership: non-owner and missing locks get distinct answers
// ---------------------------------------------------------------------------

async fn c06_non_owner_and_missing_locks_get_distinct_answers(app: &TestApp) {
    let name = "c06:k";
    let a = app.acquire_ttl(name, 30_000).await;
    a.expect_status(201);
    let tok_a = a.token();
    let (_, pttl_before) = app.holder(name).await.expect("A holds");
    let mut replies = Vec::new();

    let stranger = random_token();
    let r = app.release(name, &stranger).await;
    r.expect_problem(409, "not-lock-owner");
    replies.push(r);
    let r = app.extend_ttl(name, &stranger, 60_000).await;
    r.expect_problem(409, "not-lock-owner");
    replies.push(r);
    let (holder, pttl_after) = app.holder(name).await.expect("A's lock is gone");
    assert_eq!(holder, tok_a);
    assert!(
        pttl_after <= pttl_before,
        "a stranger moved A's lease: {pttl_before} -> {pttl_after}"
    );

    let path = format!("/locks/{name}");
    for method in [Method::DELETE, Method::PATCH] {
        let r = app.send(method, &path, &[], None).await;
        r.expect_problem(400, "invalid-request");
        replies.push(r);
    }

    for token in [stranger.as_str(), tok_a.as_str()] {
        let r = app.release("c06:nobody", token).await;
        r.expect_problem(404, "lock-not-held");
        replies.push(r);
        let r = app.extend_ttl("c06:nobody", token, 5000).await;
        r.expect_problem(404, "lock-not-held");
        replies.push(r);
    }
    assert_eq!(app.holder("c06:nobody").await, None);

    for r in &replies {
        assert!(!r.status.is_success(), "{} answered {}", r.text, r.status);
    }
    let r = app.inspect(name).await;
    r.expect_status(200);
    replies.push(r);
    replies.push(app.acquire_ttl(name, 5000).await);
    for r in &replies {
        assert!(!r.text.contains(&tok_a), "tok_A leaked: {}", r.text);
        for value in r.headers.values() {
            assert!(!value.to_str().unwrap_or("").contains(&tok_a));
        }
    }
    assert_eq!(app.holder_token(name).await, Some(tok_a));
}

// ---------------------------------------------------------------------------
// C07 ownership: tokens are unguessable and per-acquisition
// ---------------------------------------------------------------------------

const BASE64URL: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

async fn c07_concurrent_tokens_are_distinct_with_128_random_bits(app: &TestApp) {
    let grants = join_all((0..200).map(|i| async move {
        let reply = app.acquire_ttl(&format!("c07:tok:{i}"), 30_000).await;
        reply.expect_status(201);
        reply.token()
    }))
    .await;
    let distinct: HashSet<&String> = grants.iter().collect();
    assert_eq!(distinct.len(), 200, "repeated tokens");
    for token in &grants {
        // 22 base64 characters carry 132 bits.
        assert!(token.len() >= 22, "token {token:?} is under 128 bits");
        assert!(
            token.chars().all(|c| BASE64URL.contains(c)),
            "token {token:?} is not base64url"
        );
    }
    // Random tokens vary in every position; counters, timestamps or a
    // per-process prefix would not.
    for position in 0..22 {
        let seen: HashSet<char> = grants
            .iter()
            .map(|t| t.chars().nth(position).expect("long enough"))
            .collect();
        assert!(
            seen.len() >= 16,
            "position {position} takes only {} values over 200 tokens",
            seen.len()
        );
    }
    for i in [0, 99, 199] {
        let name = format!("c07:tok:{i}");
        assert_eq!(app.holder_token(&name).await.as_ref(), Some(&grants[i]));
    }
}

async fn c07_concurrent_acquires_of_one_name_grant_exactly_one(app: &TestApp) {
    let body = json!({ "ttl_ms": 30_000 });
    let replies = join_all((0..50).map(|_| app.acquire("c07:one", Some(body.clone())))).await;
    let granted: Vec<&Reply> = replies.iter().filter(|r| r.status == 201).collect();
    if app.is_redlock() {
        // Redlock may split the vote among 50 simultaneous acquires, so
        // that none gets a quorum (the Redis page's "split brain"): at
        // most one, by design.
        assert!(granted.len() <= 1, "grants: {granted:?}");
    } else {
        assert_eq!(granted.len(), 1, "grants: {granted:?}");
    }
    for r in replies.iter().filter(|r| r.status != 201) {
        r.expect_problem(409, "lock-held");
    }
    assert_eq!(
        app.holder_token("c07:one").await,
        granted.first().map(|g| g.token()),
        "the holder is the one grant, or nobody after a split vote"
    );
}

async fn c07_token_of_one_lock_cannot_touch_another(app: &TestApp) {
    let x = app.acquire_ttl("c07:x", 30_000).await;
    x.expect_status(201);
    let y = app.acquire_ttl("c07:y", 30_000).await;
    y.expect_status(201);
    let (tok_x, tok_y) = (x.token(), y.token());

    app.extend_ttl("c07:y", &tok_x, 60_000)
        .await
        .expect_problem(409, "not-lock-owner");
    app.release("c07:y", &tok_x)
        .await
        .expect_problem(409, "not-lock-owner");
    // Acquiring Y with X's token must not count as a renewal.
    app.acquire("c07:y", Some(json!({ "token": tok_x, "ttl_ms": 60_000 })))
        .await
        .expect_problem(409, "lock-held");
    app.extend_ttl("c07:z", &tok_x, 60_000)
        .await
        .expect_problem(404, "lock-not-held");
    app.release("c07:z", &tok_x)
        .await
        .expect_problem(404, "lock-not-held");

    let (holder_y, pttl_y) = app.holder("c07:y").await.expect("Y held");
    assert_eq!(holder_y, tok_y);
    assert!(pttl_y <= 30_000, "X's token moved Y's lease to {pttl_y}");
    assert_eq!(app.holder_token("c07:x").await, Some(tok_x));
    assert_eq!(app.holder("c07:z").await, None);
}
