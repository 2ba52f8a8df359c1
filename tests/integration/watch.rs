//! Watches through HTTP, as clients read them: `GET /locks/{name}/events`
//! and `GET /semaphores/{name}/events` as Server-Sent Events, on a real
//! Redis (changes made through a second lockd instance), on the memory
//! backend, and on a Redis Cluster. Field cases C22 (a watch ends where
//! `GET` ends; a release is never reported as an expiry, nor the other way)
//! and C23 (expiry is reported without keyspace notifications), the first
//! `state` event, reconnecting, the watcher cap, keep-alive comments,
//! shutdown with open streams, bad input, Redlock's refusal, and no token
//! in any event.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{
    EventStream, SseEvent, TestApp, eventually, metric, ms_until, shared_cluster,
};

/// One test per listed `async fn name(app: &TestApp, other: &TestApp)`:
/// on a fresh Redis with `other` a second lockd on it (`redis::name`), and
/// on the memory backend with `other` the same instance (`memory::name`).
macro_rules! watch_tests {
    ($($name:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let app = crate::support::TestApp::redis().await;
                    let other = app.sibling(|_| {}).await;
                    super::$name(&app, &other).await;
                }
            )*
        }
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let app = crate::support::TestApp::memory().await;
                    super::$name(&app, &app).await;
                }
            )*
        }
    };
}

watch_tests!(
    the_first_event_is_the_state_as_get_shows_it,
    c22_watch_final_state_a_watch_ends_where_get_ends,
    c22_a_release_is_released_and_a_lapse_is_expired,
    c23_watch_expiry_is_reported_within_a_second_of_the_lease_end,
    every_change_through_another_instance_arrives_in_order,
    a_reconnecting_watcher_gets_a_fresh_state_first,
    a_semaphore_watch_reports_each_permit_with_its_fence,
    no_event_ever_carries_a_token,
    a_permit_that_ran_out_is_expired_before_the_next_one_is_acquired,
);

const WAIT: Duration = Duration::from_secs(5);

fn events(name: &str) -> String {
    format!("/locks/{name}/events")
}

async fn watch(app: &TestApp, name: &str) -> EventStream {
    EventStream::open(app, &events(name), &[]).await
}

/// Takes `name` for `ttl_ms` with `owner` through `app`: (token, fence).
async fn take(app: &TestApp, name: &str, ttl_ms: u64, owner: &str) -> (String, u64) {
    let reply = app
        .acquire(name, Some(json!({"ttl_ms": ttl_ms, "owner": owner})))
        .await;
    reply.expect_status(201);
    (reply.token(), reply.fence())
}

/// The fence `GET /locks/{name}` shows, or `None` when free.
async fn fence_of(app: &TestApp, name: &str) -> Option<u64> {
    let reply = app.inspect(name).await;
    (reply.status == 200).then(|| reply.fence())
}

async fn the_first_event_is_the_state_as_get_shows_it(app: &TestApp, _other: &TestApp) {
    let mut free = watch(app, "job").await;
    let state = free.expect("state").await;
    assert_eq!(state.data, json!({"name": "job", "held": false}));
    assert_eq!(state.id.split('-').next(), Some("0"), "{state:?}");

    let (_, fence) = take(app, "held", 30_000, "worker-1").await;
    let mut held = watch(app, "held").await;
    let state = held.expect("state").await;
    let get = app.inspect("held").await.json();
    for field in ["name", "held", "fence", "owner", "granted_at"] {
        assert_eq!(state.data[field], get[field], "{field}: {state:?} vs {get}");
    }
    assert_eq!(state.fence(), fence);
    let ttl = state.data["ttl_ms"].as_u64().expect("ttl_ms");
    assert!(ttl <= 30_000 && ttl > 29_000, "{ttl}");
    assert!(state.id.starts_with(&format!("{fence}-")), "{state:?}");
}

/// C22: acquire A, release, acquire B in quick succession, through two
/// instances: the watch's last event says B holds the lock with B's fence,
/// as `GET` does, after A's `acquired` and `released`.
async fn c22_watch_final_state_a_watch_ends_where_get_ends(app: &TestApp, other: &TestApp) {
    for round in 0..5 {
        let name = format!("job-{round}");
        let mut stream = watch(app, &name).await;
        stream.expect("state").await;
        let (a, a_fence) = take(other, &name, 30_000, "A").await;
        other.release(&name, &a).await.expect_status(204);
        let (_, b_fence) = take(app, &name, 30_000, "B").await;

        let acquired = stream.expect("acquired").await;
        assert_eq!(
            (acquired.fence(), acquired.data["owner"].clone()),
            (a_fence, json!("A"))
        );
        assert_eq!(stream.expect("released").await.fence(), a_fence);
        let last = stream.expect("acquired").await;
        assert_eq!(
            (last.fence(), last.data["owner"].clone()),
            (b_fence, json!("B"))
        );
        assert_eq!(fence_of(app, &name).await, Some(last.fence()));
        assert!(stream.next(Duration::from_millis(200)).await.is_none());
    }
}

/// C22, the other half: a lease that ran out is `expired`, never
/// `released`, even when the next holder takes the lock at once; a
/// release is `released`, never `expired`, even just before its lease's
/// end.
async fn c22_a_release_is_released_and_a_lapse_is_expired(app: &TestApp, other: &TestApp) {
    let mut stream = watch(app, "job").await;
    stream.expect("state").await;
    // A's lease runs out; B (through the other instance) waits for it.
    let (_, a_fence) = take(other, "job", 300, "A").await;
    let waiter = other
        .acquire(
            "job",
            Some(json!({"ttl_ms": 400, "wait_ms": 3000, "owner": "B"})),
        )
        .await;
    waiter.expect_status(201);
    let (b, b_fence) = (waiter.token(), waiter.fence());
    assert_eq!(stream.expect("acquired").await.fence(), a_fence);
    assert_eq!(stream.expect("expired").await.fence(), a_fence);
    assert_eq!(stream.expect("acquired").await.fence(), b_fence);
    // B releases with little of its lease left: released, not expired.
    let left = ms_until(&waiter.str("expires_at"));
    tokio::time::sleep(Duration::from_millis(u64::try_from(left - 40).unwrap_or(0))).await;
    let released = other.release("job", &b).await;
    if released.status == 204 {
        assert_eq!(stream.expect("released").await.fence(), b_fence);
    } else {
        // The machine was too slow to release in time: then it ran out.
        assert_eq!(stream.expect("expired").await.fence(), b_fence);
    }
    assert!(stream.next(Duration::from_millis(300)).await.is_none());
    assert_eq!(fence_of(app, "job").await, None);
}

/// C23: a lease of 800 ms, never released, is reported `expired` within 1 s
/// of its end, with Redis's keyspace notifications left off.
async fn c23_watch_expiry_is_reported_within_a_second_of_the_lease_end(
    app: &TestApp,
    _other: &TestApp,
) {
    if app.is_redis() {
        let notify: Vec<String> = app
            .redis_server()
            .cmd(
                ::redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("notify-keyspace-events"),
            )
            .await;
        assert_eq!(notify.get(1).map(String::as_str), Some(""), "{notify:?}");
    }
    let mut stream = watch(app, "job").await;
    stream.expect("state").await;
    let granted = app.acquire_ttl("job", 800).await;
    granted.expect_status(201);
    let ends = Instant::now() + Duration::from_millis(800);
    assert_eq!(stream.expect("acquired").await.fence(), granted.fence());
    let expired = stream
        .next(Duration::from_secs(3))
        .await
        .expect("an expired event");
    let late = Instant::now().saturating_duration_since(ends);
    assert_eq!(
        (expired.event.as_str(), expired.fence()),
        ("expired", granted.fence())
    );
    assert!(
        late < Duration::from_secs(1),
        "reported {late:?} after the lease's end"
    );
}

/// Every change made through another instance arrives, once, in order:
/// acquired, extended (by extend and by the holder's renewing acquire),
/// released, for several holders one after another.
async fn every_change_through_another_instance_arrives_in_order(app: &TestApp, other: &TestApp) {
    let mut stream = watch(app, "job").await;
    stream.expect("state").await;
    let mut expected: Vec<(&str, u64)> = Vec::new();
    for i in 0..10 {
        let owner = format!("holder-{i}");
        let (token, fence) = take(other, "job", 10_000, &owner).await;
        expected.push(("acquired", fence));
        other
            .extend_ttl("job", &token, 20_000)
            .await
            .expect_status(200);
        expected.push(("extended", fence));
        other
            .send_json(
                Method::POST,
                "/locks/job",
                &[("Lock-Token", &token)],
                Some(json!({"ttl_ms": 5000})),
            )
            .await
            .expect_status(200);
        expected.push(("extended", fence));
        other.release("job", &token).await.expect_status(204);
        expected.push(("released", fence));
    }
    let mut seen = Vec::new();
    let mut last_seq = 0u64;
    while seen.len() < expected.len() {
        let event = stream.next(WAIT).await.expect("an event");
        let seq: u64 = event.id.rsplit('-').next().unwrap().parse().unwrap();
        assert!(seq > last_seq, "ids grow: {event:?} after {last_seq}");
        last_seq = seq;
        seen.push(event);
    }
    let seen: Vec<(&str, u64)> = seen.iter().map(|e| (e.event.as_str(), e.fence())).collect();
    assert_eq!(seen, expected);
    let extended = &seen[1];
    assert_eq!(extended.0, "extended");
}

/// A client that reconnects gets a fresh `state` first: what the lock is
/// now, not what it missed.
async fn a_reconnecting_watcher_gets_a_fresh_state_first(app: &TestApp, other: &TestApp) {
    let mut first = watch(app, "job").await;
    assert_eq!(first.expect("state").await.data["held"], json!(false));
    drop(first);
    let (_, fence) = take(other, "job", 30_000, "A").await;
    let mut again = watch(app, "job").await;
    let state = again.expect("state").await;
    assert_eq!(
        (state.data["held"].clone(), state.fence()),
        (json!(true), fence)
    );
    // A watcher that joins a lock already watched gets the state too.
    let mut second = watch(app, "job").await;
    assert_eq!(second.expect("state").await.fence(), fence);
}

async fn a_semaphore_watch_reports_each_permit_with_its_fence(app: &TestApp, other: &TestApp) {
    let mut stream = EventStream::open(app, "/semaphores/pool/events", &[]).await;
    let state = stream.expect("state").await;
    assert_eq!(state.data["held"], json!(false));
    let take = |ttl_ms: u64, owner: &'static str| async move {
        let reply = other
            .send_json(
                Method::POST,
                "/semaphores/pool",
                &[],
                Some(json!({"limit": 2, "ttl_ms": ttl_ms, "owner": owner})),
            )
            .await;
        reply.expect_status(201);
        (reply.token(), reply.fence())
    };
    let (_, short) = take(500, "short").await;
    let (long_token, long) = take(30_000, "long").await;
    let first = stream.expect("acquired").await;
    assert_eq!(
        (first.fence(), first.data["owner"].clone()),
        (short, json!("short"))
    );
    assert_eq!(stream.expect("acquired").await.fence(), long);
    // A watcher that joins now sees both permits and the limit.
    let mut late = EventStream::open(app, "/semaphores/pool/events", &[]).await;
    let state = late.expect("state").await;
    assert_eq!(state.data["holders"], json!(2));
    assert_eq!(state.data["limit"], json!(2));
    let fences: Vec<u64> = state.data["permits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["fence"].as_u64().unwrap())
        .collect();
    assert_eq!(fences, vec![short, long]);
    // The short one runs out; the long one is given back.
    assert_eq!(stream.expect("expired").await.fence(), short);
    other
        .send(
            Method::DELETE,
            "/semaphores/pool",
            &[("Lock-Token", &long_token)],
            None,
        )
        .await
        .expect_status(204);
    assert_eq!(stream.expect("released").await.fence(), long);
    assert_eq!(late.expect("expired").await.fence(), short);
    assert_eq!(late.expect("released").await.fence(), long);
}

async fn no_event_ever_carries_a_token(app: &TestApp, other: &TestApp) {
    let mut stream = watch(app, "job").await;
    let mut semaphore = EventStream::open(app, "/semaphores/job/events", &[]).await;
    let mut tokens = Vec::new();
    let (token, _) = take(other, "job", 300, "A").await;
    tokens.push(token.clone());
    other
        .extend_ttl("job", &token, 300)
        .await
        .expect_status(200);
    let permit = other
        .send_json(
            Method::POST,
            "/semaphores/job",
            &[],
            Some(json!({"limit": 1, "ttl_ms": 300})),
        )
        .await;
    permit.expect_status(201);
    tokens.push(permit.token());
    let mut all: Vec<SseEvent> = Vec::new();
    for s in [&mut stream, &mut semaphore] {
        while let Some(event) = s.next(Duration::from_millis(1500)).await {
            all.push(event);
        }
    }
    let kinds: Vec<&str> = all.iter().map(|e| e.event.as_str()).collect();
    assert!(
        kinds.contains(&"expired") && kinds.contains(&"extended"),
        "{kinds:?}"
    );
    for event in &all {
        let text = format!("{} {}", event.id, event.data);
        for token in &tokens {
            assert!(!text.contains(token.as_str()), "{event:?}");
        }
        assert!(!text.contains("token"), "{event:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_cap_answers_503_past_max_watchers() {
    let app = TestApp::redis_with(|s| s.limits.max_watchers = 2.try_into().unwrap()).await;
    let mut a = watch(&app, "a").await;
    let mut b = watch(&app, "b").await;
    a.expect("state").await;
    b.expect("state").await;
    let metrics = app.metrics().await;
    assert_eq!(metric(&metrics, "lockd_watchers", &[]), Some(2.0));
    let Err((status, body)) = EventStream::try_open(&app, &events("c"), &[]).await else {
        panic!("a third watch past the cap");
    };
    assert_eq!(status, 503, "{body}");
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        problem["type"],
        json!("urn:lockd:problem:too-many-watchers")
    );
    drop(a);
    assert!(
        eventually(WAIT, || async {
            metric(&app.metrics().await, "lockd_watchers", &[]) == Some(1.0)
        })
        .await
    );
    let mut c = watch(&app, "c").await;
    c.expect("state").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_gets_a_keep_alive_comment() {
    let app = TestApp::memory_with(|s| s.limits.watch_keepalive = Duration::from_millis(200)).await;
    let mut stream = watch(&app, "job").await;
    stream.expect("state").await;
    assert!(stream.next(Duration::from_millis(900)).await.is_none());
    assert!(stream.comments >= 2, "{} comments", stream.comments);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_end_cleanly_at_shutdown() {
    let app = TestApp::redis().await;
    let mut streams = Vec::new();
    for name in ["a", "a", "b"] {
        let mut stream = watch(&app, name).await;
        stream.expect("state").await;
        streams.push(stream);
    }
    app.shut_down();
    for stream in &mut streams {
        assert!(
            stream.ends_within(Duration::from_secs(3)).await,
            "the stream ended"
        );
    }
    assert!(
        app.stopped_within(Duration::from_secs(5)).await,
        "lockd stopped"
    );
}

/// `?wait_ms=N` ends a watch once N ms have passed (for a caller with a
/// time limit of its own), after the `state` and any change before then;
/// `wait_ms=0` gives the `state` alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_with_wait_ms_ends_once_it_has_passed() {
    let app = TestApp::redis().await;
    for (path, wait) in [
        ("/locks/bounded/events?wait_ms=300", 300),
        ("/semaphores/bounded/events?wait_ms=300", 300),
        ("/runs/bounded/events?wait_ms=300", 300),
        ("/locks/bounded/events?wait_ms=0", 0),
    ] {
        let started = Instant::now();
        // Bounded by the stream's end; a stream that never ends fails here.
        let reply = tokio::time::timeout(
            Duration::from_secs(60),
            app.send(Method::GET, path, &[], None),
        )
        .await
        .unwrap_or_else(|_| panic!("{path}: the stream did not end"));
        reply.expect_status(200);
        assert!(
            started.elapsed() >= Duration::from_millis(wait),
            "{path}: ended after {:?}",
            started.elapsed()
        );
        assert!(
            reply.text.starts_with("event: state\n"),
            "{path}: {}",
            reply.text
        );
        assert_eq!(
            reply.text.matches("event: ").count(),
            1,
            "{path}: {}",
            reply.text
        );
    }
    // A change within the wait arrives before the end.
    let watching = {
        let url = app.url("/locks/bounded:2/events?wait_ms=5000");
        tokio::spawn(async move { reqwest::get(url).await?.text().await })
    };
    assert!(
        eventually(Duration::from_secs(20), || async {
            metric(&app.metrics().await, "lockd_watchers", &[]) == Some(1.0)
        })
        .await,
        "the watch never opened"
    );
    take(&app, "bounded:2", 60_000, "w").await;
    let text = tokio::time::timeout(Duration::from_secs(60), watching)
        .await
        .expect("the stream ended")
        .expect("task")
        .expect("the stream");
    assert!(text.starts_with("event: state\n"), "{text}");
    assert!(text.contains("event: acquired\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_are_400_and_write_nothing() {
    let app = TestApp::redis().await;
    for path in [
        "/locks/a%20b/events",
        "/locks/%7Bx%7D/events",
        "/semaphores/a%2Fb/events",
        "/locks/job/events?ttl_ms=5",
        "/locks/job/events?wait_ms=-1",
        "/locks/job/events?wait_ms=1.5",
        "/semaphores/job/events?wait_ms=abc",
        "/runs/job/events?wait_ms=3600001",
        "/runs/job/events?wait_ms=5&wait_ms=6",
    ] {
        let reply = app.send(Method::GET, path, &[], None).await;
        reply.expect_status(400);
        assert_eq!(
            reply.header("content-type").as_deref(),
            Some("application/problem+json"),
            "{path}"
        );
    }
    assert!(app.redis_server().keys().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_watches_with_501() {
    let app = TestApp::redlock(3, |_| {}).await;
    for path in ["/locks/job/events", "/semaphores/pool/events"] {
        let reply = app.send(Method::GET, path, &[], None).await;
        let problem = reply.expect_problem(501, "not-implemented");
        assert!(
            problem["detail"].as_str().unwrap().contains("Redlock"),
            "{problem}"
        );
    }
    let metrics = app.metrics().await;
    assert_eq!(metric(&metrics, "lockd_watchers", &[]), Some(0.0));
}

/// When the change stream was lost and is back, a watcher learns what it
/// missed: a `state` (or the change itself) that matches `GET`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_catches_up_after_its_event_connection_is_lost() {
    let app = TestApp::redis().await;
    let other = app.sibling(|_| {}).await;
    let mut stream = watch(&app, "job").await;
    stream.expect("state").await;
    let killed: i64 = app
        .redis_server()
        .cmd(::redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"))
        .await;
    assert!(killed >= 1, "{killed}");
    // Changed while the subscription may be down.
    let (_, fence) = take(&other, "job", 30_000, "A").await;
    let mut last = None;
    while let Some(event) = stream.next(Duration::from_secs(3)).await {
        last = Some(event);
    }
    let last = last.expect("the change, or a fresh state");
    assert!(
        matches!(last.event.as_str(), "acquired" | "state"),
        "{last:?}"
    );
    assert_eq!(last.fence(), fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_redis_cluster_hears_changes_from_another_instance() {
    let cluster = shared_cluster();
    let app = TestApp::cluster_on(cluster.clone(), |_| {}).await;
    let other = TestApp::cluster_on(cluster, |_| {}).await;
    let name = format!("watched-{}", crate::support::random_token());
    let mut stream = watch(&app, &name).await;
    stream.expect("state").await;
    // The sharded subscription is made after the first read: a change just
    // then is caught up by the read after it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (token, fence) = take(&other, &name, 500, "A").await;
    assert_eq!(stream.expect("acquired").await.fence(), fence);
    other
        .extend_ttl(&name, &token, 600)
        .await
        .expect_status(200);
    assert_eq!(stream.expect("extended").await.fence(), fence);
    assert_eq!(stream.expect("expired").await.fence(), fence);
    let (token, fence) = take(&other, &name, 30_000, "B").await;
    assert_eq!(stream.expect("acquired").await.fence(), fence);
    other.release(&name, &token).await.expect_status(204);
    assert_eq!(stream.expect("released").await.fence(), fence);
}

/// The JSON lines `lockd watch` printed so far.
fn printed(watcher: &crate::support::Lockd) -> Vec<Value> {
    watcher
        .stdout()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

/// `lockd watch` prints each event as a JSON line (`event` first), says on
/// stderr when its stream is lost, connects again (to the next server)
/// and starts again with a fresh `state`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockd_watch_prints_json_lines_and_reconnects_when_the_stream_is_lost() {
    let app = TestApp::redis().await;
    let other = app.sibling(|_| {}).await;
    let servers = format!("{},{}", app.url(""), other.url(""));
    let mut cmd = crate::support::lockd();
    cmd.args(["watch", "--server", &servers, "job"]);
    let watcher = crate::support::Lockd::spawn(cmd);
    let seen = |n: usize| {
        let watcher = &watcher;
        async move { eventually(WAIT, || async { printed(watcher).len() >= n }).await }
    };
    assert!(seen(1).await, "the first state: {}", watcher.stderr());
    let (token, fence) = take(&other, "job", 30_000, "A").await;
    assert!(seen(2).await);
    app.shut_down();
    assert!(
        eventually(WAIT, || async {
            watcher.stderr().contains("connecting again")
        })
        .await,
        "{}",
        watcher.stderr()
    );
    assert!(seen(3).await, "a fresh state from the other server");
    other.release("job", &token).await.expect_status(204);
    assert!(seen(4).await);
    let lines = printed(&watcher);
    let kinds: Vec<&str> = lines.iter().map(|l| l["event"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["state", "acquired", "state", "released"],
        "{lines:?}"
    );
    assert_eq!(lines[1]["fence"], json!(fence));
    assert_eq!(
        (lines[2]["held"].clone(), lines[2]["fence"].clone()),
        (json!(true), json!(fence))
    );
    let first_line = watcher.stdout().lines().next().unwrap().to_owned();
    assert!(
        first_line.starts_with(r#"{"event":"state","id":"#),
        "{first_line}"
    );
    assert!(!watcher.stdout().contains(&token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockd_watch_until_free_exits_when_the_lock_is_freed_and_refusals_end_it() {
    let app = TestApp::redis().await;
    let (token, _) = take(&app, "job", 30_000, "A").await;
    let mut cmd = crate::support::lockd();
    cmd.args(["watch", "--server", &app.url(""), "--until-free", "job"]);
    let mut watcher = crate::support::Lockd::spawn(cmd);
    assert!(eventually(WAIT, || async { printed(&watcher).len() == 1 }).await);
    assert!(watcher.exited().is_none(), "held: still watching");
    app.release("job", &token).await.expect_status(204);
    let exit = watcher.wait(WAIT).await;
    exit.expect(0);
    assert!(
        exit.stdout
            .lines()
            .last()
            .unwrap()
            .contains(r#""event":"released""#)
    );

    // A name no lock can have is refused before any request: `..` would
    // otherwise reach another route once the URL is normalised.
    for name in ["a b", "..", "."] {
        let mut bad = crate::support::lockd();
        bad.args(["watch", "--server", &app.url(""), name]);
        let exit = crate::support::run(bad).await;
        exit.expect(64);
        assert!(exit.stderr.contains("not a usable name"), "{}", exit.stderr);
    }

    let redlock = TestApp::redlock(3, |_| {}).await;
    let mut refused = crate::support::lockd();
    refused.args(["watch", "--server", &redlock.url(""), "job"]);
    let exit = crate::support::run(refused).await;
    exit.expect(69);
    assert!(exit.stderr.contains("Redlock"), "{}", exit.stderr);
}

/// A permit that ran out is reported `expired` before the permit that took
/// its place is `acquired`, and a watch never shows more permits than the
/// limit, even when the next permit is taken (through another instance)
/// the moment the first runs out: the script that forgets an expired
/// permit says so first.
async fn a_permit_that_ran_out_is_expired_before_the_next_one_is_acquired(
    app: &TestApp,
    other: &TestApp,
) {
    let mut stream = EventStream::open(app, "/semaphores/pool/events", &[]).await;
    stream.expect("state").await;
    let take = |ttl_ms: u64| {
        other.send_json(
            Method::POST,
            "/semaphores/pool",
            &[],
            Some(json!({"limit": 1, "ttl_ms": ttl_ms})),
        )
    };
    let mut expected = Vec::new();
    // Many rounds: the next permit must often be taken within a
    // millisecond of the last one's end, when Redis would expire the keys.
    for _ in 0..30 {
        let first = take(100).await;
        first.expect_status(201);
        expected.push(("acquired", first.fence()));
        // Fail fast until the permit ran out and the next is granted.
        let next = loop {
            let reply = take(100).await;
            if reply.status == 201 {
                break reply;
            }
            reply.expect_problem(409, "semaphore-full");
        };
        expected.push(("expired", first.fence()));
        expected.push(("acquired", next.fence()));
        expected.push(("expired", next.fence()));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let mut seen = Vec::new();
    while seen.len() < expected.len() {
        let event = stream.next(WAIT).await.expect("an event");
        if let Some(holders) = event.data["holders"].as_u64() {
            assert!(holders <= 1, "more holders than the limit: {event:?}");
        }
        seen.push((event.event.clone(), event.fence()));
    }
    let seen: Vec<(&str, u64)> = seen.iter().map(|(k, f)| (k.as_str(), *f)).collect();
    assert_eq!(seen, expected);
}

/// Redis restarts without persistence while a lock is held and a waiter
/// queued: the lease did not run out (Redis lost it), so the watch says
/// what is now with a `state`, never `expired`, and ends where `GET` ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_loses_its_data_a_watch_sends_a_state_not_an_expiry() {
    let app = TestApp::redis().await;
    let other = app.sibling(|_| {}).await;
    let (_, held) = take(&other, "job", 15_000, "A").await;
    let waiter = other.spawn_wait("job", 5_000, 20_000);
    let mut stream = watch(&app, "job").await;
    assert_eq!(stream.expect("state").await.fence(), held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    app.redis_server().stop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    app.redis_server().start().await;
    let granted = waiter.await.unwrap().unwrap();
    granted.expect_status(201);
    let mut events = Vec::new();
    while let Some(event) = stream.next(Duration::from_secs(3)).await {
        events.push(event);
    }
    assert!(
        events
            .iter()
            .all(|e| e.event != "expired" && e.event != "released"),
        "{events:?}"
    );
    assert!(events.iter().any(|e| e.event == "state"), "{events:?}");
    let last = events.last().expect("events after the restart");
    assert_eq!(last.fence(), granted.fence(), "{events:?}");
    assert_eq!(fence_of(&app, "job").await, Some(granted.fence()));
}

/// A stream that goes silent (the server or the link hangs: here a proxy
/// that holds every byte) counts as lost after `--idle-timeout-ms`: `lockd
/// watch` says so and moves to the next server, which sends a fresh state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockd_watch_leaves_a_stream_that_went_silent_for_the_next_server() {
    let app = TestApp::redis().await;
    let other = app.sibling(|_| {}).await;
    let proxy = crate::support::LinkProxy::start(app.addr.port()).await;
    let servers = format!("{},{}", proxy.http_url(), other.url(""));
    let mut cmd = crate::support::lockd();
    cmd.args([
        "watch",
        "--server",
        &servers,
        "--idle-timeout-ms",
        "1000",
        "job",
    ]);
    let watcher = crate::support::Lockd::spawn(cmd);
    assert!(eventually(WAIT, || async { printed(&watcher).len() == 1 }).await);
    // The next event through the proxy freezes the link, held.
    proxy.freeze_on_answer(b"acquired");
    let (_, fence) = take(&other, "job", 30_000, "A").await;
    assert!(
        eventually(WAIT, || async { printed(&watcher).len() >= 2 }).await,
        "a fresh state from the other server: {}",
        watcher.stderr()
    );
    let lines = printed(&watcher);
    assert_eq!(lines[1]["event"], json!("state"), "{lines:?}");
    assert_eq!(lines[1]["fence"], json!(fence));
    assert!(
        watcher.stderr().contains("not even a keep-alive"),
        "{}",
        watcher.stderr()
    );
    proxy.thaw();
}

/// Grants made and ended while a lockd's change subscription was down (the
/// lock free before and after) are not silently skipped: once the
/// subscription is back, the watch gets a fresh `state`, since the lock's
/// fence counter moved (issue 28, item 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_missed_while_the_subscription_was_down_give_a_fresh_state() {
    let redis = std::sync::Arc::new(crate::support::RedisServer::spawn().await);
    let proxy = crate::support::LinkProxy::start(redis.port()).await;
    let url = proxy.url();
    let watched = TestApp::redis_on(redis.clone(), |s| s.store.redis_urls = vec![url.into()]).await;
    let other = TestApp::redis_on(redis.clone(), |_| {}).await;
    let (token, _) = take(&other, "gap", 30_000, "before").await;
    other.release("gap", &token).await.expect_status(204);
    let mut stream = watch(&watched, "gap").await;
    assert_eq!(stream.expect("state").await.data["held"], json!(false));
    let mut permits = EventStream::open(&watched, "/semaphores/gap/events", &[]).await;
    permits.expect("state").await;
    // The watched lockd loses Redis, its subscription with it, and cannot
    // come back yet; meanwhile the lock is taken and given back.
    proxy.set_down(true);
    proxy.cut();
    let (token, fence) = take(&other, "gap", 30_000, "in the gap").await;
    other.release("gap", &token).await.expect_status(204);
    let permit = other
        .send_json(
            Method::POST,
            "/semaphores/gap",
            &[],
            Some(json!({"limit": 2, "ttl_ms": 30_000})),
        )
        .await;
    permit.expect_status(201);
    other
        .send(
            Method::DELETE,
            "/semaphores/gap",
            &[("Lock-Token", permit.token().as_str())],
            None,
        )
        .await
        .expect_status(204);
    assert!(stream.next(Duration::from_millis(300)).await.is_none());
    proxy.set_down(false);
    let event = stream
        .next(Duration::from_secs(15))
        .await
        .unwrap_or_else(|| panic!("no event after the gap (fence {fence} was missed)"));
    assert_eq!(event.event, "state", "{event:?}");
    assert_eq!(event.data["held"], json!(false), "{event:?}");
    let event = permits
        .next(Duration::from_secs(15))
        .await
        .expect("no semaphore event after the gap");
    assert_eq!(event.event, "state", "{event:?}");
}
