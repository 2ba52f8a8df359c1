//! Mutual-exclusion torture test: many clients fight over a few locks with
//! short random leases, some holders pause past their lease (a simulated GC
//! pause), and Redis is killed (SIGKILL) and started again in the middle.
//! Redis runs as docs/design.md recommends for a single instance, with AOF and
//! `appendfsync always`, so the restart keeps locks and fence counters.
//!
//! The CI form (about 20 s of load: 32 clients, 4 names, one restart):
//!
//! ```text
//! cargo test --test torture -- --nocapture
//! ```
//!
//! The long form (10 minutes, 128 clients):
//!
//! ```text
//! LOCKD_TORTURE_SECONDS=600 LOCKD_TORTURE_CLIENTS=128 cargo test --release --test torture -- --nocapture
//! ```
//!
//! Other knobs, all optional: `LOCKD_TORTURE_NAMES` (4),
//! `LOCKD_TORTURE_RESTARTS` (1, spread evenly over the run) and
//! `LOCKD_TORTURE_SEED` (random; printed, though a run also depends on
//! timing).
//!
//! Each client loops: acquire a random name with a TTL of 150 to 500 ms,
//! half the time failing fast (`wait_ms` 0; a 409 backs off a few ms with
//! jitter), half the time waiting up to 300 ms; a 503 backs off 20 to 60 ms.
//! A holder writes `(fence, client)` to that name's protected resource, an
//! in-test store that accepts a write only with a fence above the last one it
//! accepted (`WHERE last_fence < $fence`); 5% of holders first pause for
//! their TTL plus 50 to 250 ms. Then it works 0 to 20 ms and releases.
//!
//! A lease is known on the client side from the grant's `expires_at`, which
//! errs early (lockd counts it from the moment it sent the script to Redis,
//! and truncates it to the millisecond). A holder is *live* at an instant
//! before that. A holder that did not pause on purpose may still outlive its
//! lease when the machine stalls it; it is then judged like a paused one,
//! and counted as an overrun in the summary. The checker asserts, for each
//! name:
//!
//! - **Fences grow in grant order** (grants ordered by the arrival of their
//!   201). A grant whose lease had already run out when its 201 arrived (a
//!   very slow answer) is left out, and counted: correct locking may then
//!   order it either way.
//! - **The protected resource**: every write by a live holder is accepted (a
//!   refusal means a higher or equal fence was granted while it held the
//!   lock); every write after one with a higher fence is refused; and some
//!   stale writes were refused, so the run did exercise fencing.
//! - **Mutual exclusion**: the intervals from a 201's arrival to the moment
//!   the holder sent its DELETE, cut at its lease end (so a paused holder
//!   counts up to its lease end), never overlap. Each is inside the
//!   server-side lease, so an overlap is a real violation.
//! - **No 5xx but 503 `backend-unavailable` during an outage**: such a 503
//!   is allowed only for a request that overlapped [Redis killed, Redis
//!   answering again + 300 ms]; any other 5xx, or a request that got no
//!   answer, fails the test. The one other excuse is a stall that Redis
//!   itself recorded (its latency monitor is on, threshold 100 ms): on a
//!   busy disk one `appendfsync always` write can stall Redis for over a
//!   second, lockd's default `redis_timeout_ms`, and then a 503 is what
//!   docs/design.md promises. Such 503s are counted apart in the summary, and every
//!   stall is printed.
//! - **No lock left behind**: once every client stopped and the longest TTL
//!   passed, Redis holds only the fence counters `lockd:{NAME}:fence`.
//!
//! It also checks that no release answered before the lease end was refused
//! (a 404 or 409 then means the lock was lost early), that each grant's
//! `expires_at` lies within the request's round trip plus its TTL (else the
//! checks above could be too lenient), and that grants resumed after the last
//! restart. A one-line summary is printed at the end, then a line of latency
//! percentiles per kind of request and answer, and Redis's stalls (see them
//! with `--nocapture`).

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::support::{RedisServer, TestApp};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------

/// Leases asked for, in ms.
const TTL_MS: RangeInclusive<u64> = 150..=500;
/// The longest `wait_ms` (half the acquires wait a random 1..= this).
const MAX_WAIT_MS: u64 = 300;
/// The share of holds that pause past their lease before writing.
const PAUSE_CHANCE: f64 = 0.05;
/// How far past its TTL a paused holder sleeps, in ms.
const PAUSE_BEYOND_TTL_MS: RangeInclusive<u64> = 50..=250;
/// How long a holder that did not pause works after its write, in ms.
const WORK_MS: RangeInclusive<u64> = 0..=20;
/// Back-off after a 409, in ms.
const HELD_BACKOFF_MS: RangeInclusive<u64> = 2..=12;
/// Back-off after a 503 (or anything unexpected), in ms.
const UNAVAILABLE_BACKOFF_MS: RangeInclusive<u64> = 20..=60;
/// How long Redis stays down at each restart.
const REDIS_DOWN: Duration = Duration::from_millis(500);
/// How long after Redis answers again a 503 is still allowed.
const OUTAGE_SLACK: Duration = Duration::from_millis(300);
/// Client-side timeout of one HTTP request (lockd's own request timeout is
/// 10 s, plus `wait_ms` for an acquire).
const HTTP_TIMEOUT: Duration = Duration::from_secs(15);
/// Safety margin taken off each lease end converted from `expires_at` (the
/// wall clock and the monotonic clock are read one after the other).
const CLOCK_MARGIN: Duration = Duration::from_millis(1);
/// How far `expires_at` may stray from [request sent + TTL, answer read +
/// TTL] (it is truncated to the millisecond, and converted with a margin).
const EXPIRY_TOLERANCE: Duration = Duration::from_millis(3);

/// The run's shape, from the environment (defaults: the CI form).
#[derive(Debug)]
struct Params {
    load: Duration,
    clients: usize,
    names: usize,
    restarts: usize,
    seed: u64,
}

impl Params {
    fn from_env() -> Self {
        fn var(name: &str, default: u64) -> u64 {
            match std::env::var(name) {
                Ok(v) => v
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number")),
                Err(_) => default,
            }
        }
        let count = |name, default| usize::try_from(var(name, default)).unwrap();
        Self {
            load: Duration::from_secs(var("LOCKD_TORTURE_SECONDS", 20)),
            clients: count("LOCKD_TORTURE_CLIENTS", 32),
            names: count("LOCKD_TORTURE_NAMES", 4),
            restarts: count("LOCKD_TORTURE_RESTARTS", 1),
            seed: var("LOCKD_TORTURE_SEED", rand::random()),
        }
    }
}

// ---------------------------------------------------------------------------
// What the run records (times are offsets from the start of the run)
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Acquire,
    Release,
}

/// One HTTP request.
#[derive(Debug, Clone)]
struct Call {
    op: Op,
    /// Which name and client: shown in failure listings.
    #[allow(dead_code)]
    name: usize,
    #[allow(dead_code)]
    client: usize,
    /// The `wait_ms` of an acquire (0 for a release).
    wait_ms: u64,
    /// Just before it was sent.
    start: Duration,
    /// Once its answer was read.
    end: Duration,
    /// The HTTP status; 0 when no answer came.
    status: u16,
    /// The problem slug of an error answer (`lock-held`, ...), or what went
    /// wrong when no answer came.
    problem: Option<String>,
}

/// One grant, from its 201 to its release.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Hold {
    name: usize,
    client: usize,
    fence: u64,
    ttl: Duration,
    /// When the acquire was sent.
    requested: Duration,
    /// When its 201 (or 200) was read.
    granted: Duration,
    /// Its lease end, from `expires_at` (errs early).
    expires: Duration,
    /// Whether it paused past its TTL before writing.
    paused: bool,
    /// Just before its DELETE was sent.
    released: Duration,
    /// When the DELETE's answer was read.
    release_answered: Duration,
    /// The DELETE's status (0: no answer).
    release_status: u16,
}

impl Hold {
    /// Whether its lease had run out before its 201 was read.
    fn dead_on_arrival(&self) -> bool {
        self.expires <= self.granted
    }

    /// The part of its hold that is surely inside its server-side lease:
    /// from its 201 to its DELETE or its lease end, whichever came first.
    fn live_interval(&self) -> Option<(Duration, Duration)> {
        let end = self.released.min(self.expires);
        (end > self.granted).then_some((self.granted, end))
    }
}

/// One write to a protected resource.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Write {
    client: usize,
    fence: u64,
    /// When the resource took it (under its lock, so in log order).
    at: Duration,
    /// The writer's lease end.
    expires: Duration,
    /// Whether the writer paused past its TTL before writing.
    paused: bool,
    accepted: bool,
}

impl Write {
    /// Whether the writer still held its lease when it wrote.
    fn live(&self) -> bool {
        self.at < self.expires
    }
}

/// A store guarded by fencing: it accepts a write only with a fence above the
/// last one it accepted, like `UPDATE ... WHERE last_fence < $fence`.
#[derive(Debug, Default)]
struct Resource {
    last_fence: Option<u64>,
    log: Vec<Write>,
}

impl Resource {
    /// Offers a write; `at` is read once the resource is locked.
    fn write(
        &mut self,
        client: usize,
        fence: u64,
        expires: Duration,
        paused: bool,
        at: Duration,
    ) -> bool {
        let accepted = self.last_fence.is_none_or(|last| fence > last);
        if accepted {
            self.last_fence = Some(fence);
        }
        self.log.push(Write {
            client,
            fence,
            at,
            expires,
            paused,
            accepted,
        });
        accepted
    }
}

// ---------------------------------------------------------------------------
// The checker: pure functions over the records
// ---------------------------------------------------------------------------

/// Pairs of grants `(earlier, later)` of one name, in order of their 201,
/// whose fences do not strictly increase. Grants that were dead on arrival
/// are left out: a grant whose lease ran out before its 201 arrived may
/// rightly carry a smaller fence than a grant whose 201 arrived earlier.
/// Between live ones, a later 201 with a smaller fence means the later
/// grant's script ran first, and the earlier grant was made while it held.
fn fence_order_violations(holds: &[Hold]) -> Vec<(Hold, Hold)> {
    let mut by_name: BTreeMap<usize, Vec<Hold>> = BTreeMap::new();
    for hold in holds.iter().filter(|h| !h.dead_on_arrival()) {
        by_name.entry(hold.name).or_default().push(*hold);
    }
    let mut bad = Vec::new();
    for grants in by_name.values_mut() {
        grants.sort_by_key(|h| (h.granted, h.fence));
        for pair in grants.windows(2) {
            if pair[1].fence <= pair[0].fence {
                bad.push((pair[0], pair[1]));
            }
        }
    }
    bad
}

/// Pairs of holds of one name whose live intervals overlap.
fn overlapping_holds(holds: &[Hold]) -> Vec<(Hold, Hold)> {
    let mut by_name: BTreeMap<usize, Vec<(Duration, Duration, Hold)>> = BTreeMap::new();
    for hold in holds {
        if let Some((start, end)) = hold.live_interval() {
            by_name
                .entry(hold.name)
                .or_default()
                .push((start, end, *hold));
        }
    }
    let mut bad = Vec::new();
    for intervals in by_name.values_mut() {
        intervals.sort_by_key(|&(start, end, _)| (start, end));
        // The interval reaching furthest so far.
        let mut furthest: Option<(Duration, Hold)> = None;
        for &(start, end, hold) in intervals.iter() {
            match furthest {
                Some((reach, other)) if start < reach => {
                    bad.push((other, hold));
                    if end > reach {
                        furthest = Some((end, hold));
                    }
                }
                Some((reach, _)) if end <= reach => {}
                _ => furthest = Some((end, hold)),
            }
        }
    }
    bad
}

/// What one resource's write log shows.
#[derive(Debug, Default, PartialEq)]
struct WriteCheck {
    accepted: usize,
    refused: usize,
    /// Refused writes of holders that paused on purpose.
    refused_paused: usize,
    /// Refused writes of holders that did not pause but whose lease ran out
    /// anyway (the machine stalled them).
    refused_overran: usize,
    /// Accepted writes of holders whose lease had run out (nobody with a
    /// higher fence had written yet).
    accepted_stale: usize,
    /// Violations: writes refused although their writer still held its
    /// lease.
    live_refused: Vec<Write>,
    /// Violations of the resource's own rule: accepted without a fence above
    /// every earlier accepted one, or refused with one.
    misjudged: Vec<Write>,
}

/// Checks one resource's write log, in the order it took the writes.
fn check_writes(log: &[Write]) -> WriteCheck {
    let mut check = WriteCheck::default();
    let mut highest: Option<u64> = None;
    for write in log {
        let fresh = highest.is_none_or(|h| write.fence > h);
        if write.accepted != fresh {
            check.misjudged.push(*write);
        }
        if write.accepted {
            check.accepted += 1;
            highest = Some(highest.map_or(write.fence, |h| h.max(write.fence)));
            if !write.live() {
                check.accepted_stale += 1;
            }
        } else {
            check.refused += 1;
            if write.live() {
                check.live_refused.push(*write);
            } else if write.paused {
                check.refused_paused += 1;
            } else {
                check.refused_overran += 1;
            }
        }
    }
    check
}

/// Requests whose answer was a 5xx, or that got no answer, other than a 503
/// `backend-unavailable` to a request that overlapped one of the `outages`
/// (each `[from, to]`, slack included).
fn unexpected_server_errors(calls: &[Call], outages: &[(Duration, Duration)]) -> Vec<Call> {
    calls
        .iter()
        .filter(|call| call.status == 0 || call.status >= 500)
        .filter(|call| {
            let excused = call.status == 503
                && call.problem.as_deref() == Some("backend-unavailable")
                && outages
                    .iter()
                    .any(|&(from, to)| call.start <= to && call.end >= from);
            !excused
        })
        .cloned()
        .collect()
}

/// Answers that no correct lockd gives to these requests (5xx are judged by
/// [`unexpected_server_errors`]).
fn unexpected_statuses(calls: &[Call]) -> Vec<Call> {
    calls
        .iter()
        .filter(|call| {
            let expected: &[u16] = match call.op {
                Op::Acquire => &[200, 201, 409],
                Op::Release => &[204, 404, 409],
            };
            call.status != 0 && call.status < 500 && !expected.contains(&call.status)
        })
        .cloned()
        .collect()
}

/// Grants whose `expires_at` is not within [acquire sent + TTL, 201 read +
/// TTL]: the lease is counted from when lockd sent the script, which lies
/// between the two.
fn implausible_expiries(holds: &[Hold]) -> Vec<Hold> {
    holds
        .iter()
        .filter(|h| {
            h.expires + EXPIRY_TOLERANCE < h.requested + h.ttl
                || h.expires > h.granted + h.ttl + EXPIRY_TOLERANCE
        })
        .copied()
        .collect()
}

/// Holds whose release was refused (404: nobody holds it; 409: another
/// token does) although the answer came back before the lease end: Redis
/// ran the release within the lease, so the lock was lost early.
fn locks_lost_early(holds: &[Hold]) -> Vec<Hold> {
    holds
        .iter()
        .filter(|h| matches!(h.release_status, 404 | 409) && h.release_answered < h.expires)
        .copied()
        .collect()
}

/// The keys, each with its PTTL, other than those that outlive the leases
/// by design, for the fence retention (`retention_ms`): fence counters
/// (`lockd:{NAME}:fence`), histories (`lockd:{NAME}:history`), and the
/// holder hash of a lease that ran out (`lockd:{NAME}:meta` without its
/// lock key, with a TTL of at most the retention: the lease's history
/// record until the next grant).
fn leftover_keys(keys: &[(String, i64)], retention_ms: i64) -> Vec<String> {
    let present = |k: &str| keys.iter().any(|(key, _)| key == k);
    keys.iter()
        .filter(|(k, pttl)| {
            if !k.starts_with("lockd:{") {
                return true;
            }
            if k.ends_with("}:fence") || k.ends_with("}:history") {
                return false;
            }
            match k.strip_suffix(":meta") {
                Some(lock) if lock.ends_with('}') => {
                    present(lock) || *pttl <= 0 || *pttl > retention_ms
                }
                _ => true,
            }
        })
        .map(|(k, _)| k.clone())
        .collect()
}

// ---------------------------------------------------------------------------
// The clients
// ---------------------------------------------------------------------------

/// What the clients share.
struct Ctx {
    base: String,
    names: Vec<String>,
    resources: Vec<Mutex<Resource>>,
    t0: Instant,
    deadline: Instant,
}

impl Ctx {
    fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    fn lock_url(&self, name: usize) -> String {
        format!("{}/locks/{}", self.base, self.names[name])
    }

    /// The run offset of wall-clock time `at` (RFC 3339), given that offset
    /// `now` and wall-clock `now_wall` were read together; errs early by
    /// [`CLOCK_MARGIN`].
    fn offset_of(&self, at: &str, now: Duration, now_wall: SystemTime) -> Duration {
        let at = humantime::parse_rfc3339(at)
            .unwrap_or_else(|e| panic!("expires_at {at:?} is not RFC 3339: {e}"));
        let offset = match at.duration_since(now_wall) {
            Ok(ahead) => now + ahead,
            Err(behind) => now.saturating_sub(behind.duration()),
        };
        offset.saturating_sub(CLOCK_MARGIN)
    }
}

/// One client's records.
#[derive(Default)]
struct ClientLog {
    calls: Vec<Call>,
    holds: Vec<Hold>,
}

/// Reads an answer: its status (0 when none came), its body, and its problem
/// slug (or the transport error).
async fn read_answer(
    answer: Result<reqwest::Response, reqwest::Error>,
) -> (u16, String, Option<String>) {
    let response = match answer {
        Ok(response) => response,
        Err(e) => return (0, String::new(), Some(format!("no answer: {e}"))),
    };
    let status = response.status().as_u16();
    match response.text().await {
        Ok(text) => {
            let problem = (status >= 400).then(|| {
                serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v["type"].as_str().map(str::to_owned))
                    .map_or_else(
                        || format!("not a problem document: {text:?}"),
                        |t| t.trim_start_matches("urn:lockd:problem:").to_owned(),
                    )
            });
            (status, text, problem)
        }
        Err(e) => (0, String::new(), Some(format!("body lost: {e}"))),
    }
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// One client: acquire, maybe pause, write, work, release; until the
/// deadline.
async fn client(ctx: Arc<Ctx>, id: usize, seed: u64) -> ClientLog {
    let http = reqwest::Client::builder()
        .timeout(HTTP_TIMEOUT)
        .pool_max_idle_per_host(1)
        .tcp_nodelay(true)
        .build()
        .expect("HTTP client");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut log = ClientLog::default();
    while Instant::now() < ctx.deadline {
        let name = rng.random_range(0..ctx.names.len());
        let ttl_ms = rng.random_range(TTL_MS);
        let wait_ms = if rng.random_bool(0.5) {
            0
        } else {
            rng.random_range(1..=MAX_WAIT_MS)
        };
        let requested = ctx.now();
        let answer = http
            .post(ctx.lock_url(name))
            .json(&json!({ "ttl_ms": ttl_ms, "wait_ms": wait_ms }))
            .send()
            .await;
        let (status, body, problem) = read_answer(answer).await;
        let (granted, granted_wall) = (ctx.now(), SystemTime::now());
        log.calls.push(Call {
            op: Op::Acquire,
            name,
            client: id,
            wait_ms,
            start: requested,
            end: granted,
            status,
            problem,
        });
        match status {
            200 | 201 => {}
            409 => {
                tokio::time::sleep(ms(rng.random_range(HELD_BACKOFF_MS))).await;
                continue;
            }
            _ => {
                tokio::time::sleep(ms(rng.random_range(UNAVAILABLE_BACKOFF_MS))).await;
                continue;
            }
        }
        let grant: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("grant {body:?} is not JSON: {e}"));
        let token = grant["token"]
            .as_str()
            .expect("token in a grant")
            .to_owned();
        let fence = grant["fence"].as_u64().expect("fence in a grant");
        let expires_at = grant["expires_at"].as_str().expect("expires_at in a grant");
        let expires = ctx.offset_of(expires_at, granted, granted_wall);

        let paused = rng.random_bool(PAUSE_CHANCE);
        if paused {
            tokio::time::sleep(ms(ttl_ms + rng.random_range(PAUSE_BEYOND_TTL_MS))).await;
        }
        {
            let mut resource = ctx.resources[name].lock().unwrap();
            let at = ctx.now();
            resource.write(id, fence, expires, paused, at);
        }
        if !paused {
            tokio::time::sleep(ms(rng.random_range(WORK_MS))).await;
        }

        let released = ctx.now();
        let answer = http
            .delete(ctx.lock_url(name))
            .header("Lock-Token", &token)
            .send()
            .await;
        let (release_status, _, problem) = read_answer(answer).await;
        let release_answered = ctx.now();
        log.calls.push(Call {
            op: Op::Release,
            name,
            client: id,
            wait_ms: 0,
            start: released,
            end: release_answered,
            status: release_status,
            problem,
        });
        log.holds.push(Hold {
            name,
            client: id,
            fence,
            ttl: ms(ttl_ms),
            requested,
            granted,
            expires,
            paused,
            released,
            release_answered,
            release_status,
        });
        if release_status == 0 || release_status >= 500 {
            tokio::time::sleep(ms(rng.random_range(UNAVAILABLE_BACKOFF_MS))).await;
        }
    }
    log
}

/// Redis's latency monitor records events (such as `aof-fsync-always`)
/// that took at least this long.
const STALL_THRESHOLD_MS: u64 = 100;

/// A stall Redis recorded (an event such as `aof-fsync-always` that took
/// `ms`), ending within the second that starts at run offset `ended` (Redis
/// stamps it with whole seconds).
#[derive(Debug)]
struct Stall {
    event: String,
    ended: Duration,
    ms: u64,
}

impl Stall {
    /// When Redis may not have answered because of it, slack included.
    fn window(&self) -> (Duration, Duration) {
        (
            self.ended.saturating_sub(ms(self.ms)),
            self.ended + Duration::from_secs(1) + OUTAGE_SLACK,
        )
    }
}

/// Turns on Redis's latency monitor (it is off by default and not kept over
/// a restart).
async fn watch_stalls(redis: &RedisServer) {
    let _: () = redis
        .cmd(
            ::redis::cmd("CONFIG")
                .arg("SET")
                .arg("latency-monitor-threshold")
                .arg(STALL_THRESHOLD_MS),
        )
        .await;
}

/// The stalls Redis recorded since it started (`LATENCY HISTORY` of every
/// event), as run offsets from `t0_wall`: Redis's own evidence that it did
/// not answer for a while (on a busy disk, an `appendfsync always` write
/// can stall it for a second), which excuses a 503 as an outage does.
async fn stalls(redis: &RedisServer, t0_wall: SystemTime) -> Vec<Stall> {
    let latest: Vec<(String, u64, u64, u64)> =
        redis.cmd(::redis::cmd("LATENCY").arg("LATEST")).await;
    let mut stalls = Vec::new();
    for (event, ..) in latest {
        let history: Vec<(u64, u64)> = redis
            .cmd(::redis::cmd("LATENCY").arg("HISTORY").arg(&event))
            .await;
        for (unix_secs, ms) in history {
            let when = SystemTime::UNIX_EPOCH + Duration::from_secs(unix_secs);
            stalls.push(Stall {
                event: event.clone(),
                ended: when.duration_since(t0_wall).unwrap_or_default(),
                ms,
            });
        }
    }
    stalls
}

/// Fails the test, with Redis's last words, if Redis exited by itself.
fn assert_still_running(redis: &RedisServer) {
    if let Some(status) = redis.exit_status() {
        panic!(
            "redis-server exited by itself ({status}); the end of its log:\n{}",
            redis.log_tail(30)
        );
    }
}

/// Kills Redis (SIGKILL) `restarts` times, evenly spread over the run, each
/// time starting it again after [`REDIS_DOWN`]. Returns each outage as
/// [killed, answering again + [`OUTAGE_SLACK`]], and the stalls Redis
/// recorded before each kill.
async fn restart_redis(
    redis: &RedisServer,
    t0: Instant,
    t0_wall: SystemTime,
    load: Duration,
    restarts: usize,
) -> (Vec<(Duration, Duration)>, Vec<Stall>) {
    let mut outages = Vec::new();
    let mut recorded = Vec::new();
    for k in 1..=restarts {
        let at = t0 + load.mul_f64(k as f64 / (restarts + 1) as f64);
        tokio::time::sleep_until(at.into()).await;
        assert_still_running(redis);
        recorded.extend(stalls(redis, t0_wall).await);
        let killed = t0.elapsed();
        redis.stop();
        tokio::time::sleep(REDIS_DOWN).await;
        redis.start().await;
        outages.push((killed, t0.elapsed() + OUTAGE_SLACK));
        watch_stalls(redis).await;
    }
    (outages, recorded)
}

/// Latency percentiles per kind of request and answer, as one line.
fn latencies(calls: &[Call]) -> String {
    let mut groups: BTreeMap<(&str, u16), Vec<Duration>> = BTreeMap::new();
    for call in calls {
        let kind = match (call.op, call.wait_ms) {
            (Op::Acquire, 0) => "acquire",
            (Op::Acquire, _) => "acquire-wait",
            (Op::Release, _) => "release",
        };
        groups
            .entry((kind, call.status))
            .or_default()
            .push(call.end - call.start);
    }
    groups
        .into_iter()
        .map(|((kind, status), mut times)| {
            times.sort();
            let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize].as_millis();
            format!(
                "{kind} {status} x{}: p50 {} p99 {} max {} ms",
                times.len(),
                at(0.5),
                at(0.99),
                at(1.0)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// At most `n` items, one per line, and how many were left out.
fn listing<T: std::fmt::Debug>(items: &[T], n: usize) -> String {
    let mut text: String = items
        .iter()
        .take(n)
        .map(|item| format!("\n    {item:?}"))
        .collect();
    if items.len() > n {
        text.push_str(&format!("\n    ... and {} more", items.len() - n));
    }
    text
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torture_mutual_exclusion_and_fencing_survive_pauses_and_a_redis_restart() {
    let params = Params::from_env();
    println!("torture: {params:?}");
    let redis = Arc::new(RedisServer::spawn_persistent().await);
    let app = TestApp::redis_on(redis.clone(), |_| {}).await;

    watch_stalls(&redis).await;
    let (t0, t0_wall) = (Instant::now(), SystemTime::now());
    let names: Vec<String> = (0..params.names).map(|i| format!("torture-{i}")).collect();
    let ctx = Arc::new(Ctx {
        base: app.url(""),
        resources: names.iter().map(|_| Mutex::default()).collect(),
        names,
        t0,
        deadline: t0 + params.load,
    });
    let clients: Vec<_> = (0..params.clients)
        .map(|id| {
            let seed = params.seed.wrapping_add(id as u64);
            tokio::spawn(client(ctx.clone(), id, seed))
        })
        .collect();
    let (outages, mut redis_stalls) =
        restart_redis(&redis, t0, t0_wall, params.load, params.restarts).await;
    let mut calls = Vec::new();
    let mut holds = Vec::new();
    for handle in clients {
        let log = handle.await.expect("a client panicked");
        calls.extend(log.calls);
        holds.extend(log.holds);
    }
    let clients_done = t0.elapsed();
    assert_still_running(&redis);
    redis_stalls.extend(stalls(&redis, t0_wall).await);

    // Every lease has run out once the longest TTL passed since the last
    // client stopped; lockd's own cleanups (of grants whose answer was lost)
    // stop by then too.
    tokio::time::sleep(ms(*TTL_MS.end()) + Duration::from_millis(250)).await;
    let mut kept = Vec::new();
    for key in redis.keys().await {
        let pttl = redis.pttl(&key).await;
        kept.push((key, pttl));
    }
    let retention_ms = i64::try_from(app.settings.store.fence_retention.as_millis()).unwrap();
    let leftovers = leftover_keys(&kept, retention_ms);

    // Checks.
    let fence_disorder = fence_order_violations(&holds);
    let overlaps = overlapping_holds(&holds);
    let outside_outages = unexpected_server_errors(&calls, &outages);
    let redis_silent: Vec<(Duration, Duration)> = outages
        .iter()
        .copied()
        .chain(redis_stalls.iter().map(Stall::window))
        .collect();
    let server_errors = unexpected_server_errors(&outside_outages, &redis_silent);
    let excused_by_stalls = outside_outages.len() - server_errors.len();
    let odd_statuses = unexpected_statuses(&calls);
    let bad_expiries = implausible_expiries(&holds);
    let lost_early = locks_lost_early(&holds);
    let writes: Vec<WriteCheck> = ctx
        .resources
        .iter()
        .map(|r| check_writes(&r.lock().unwrap().log))
        .collect();
    let sum = |f: fn(&WriteCheck) -> usize| writes.iter().map(f).sum::<usize>();
    let live_refused: Vec<Write> = writes
        .iter()
        .flat_map(|w| w.live_refused.iter().copied())
        .collect();
    let misjudged: Vec<Write> = writes
        .iter()
        .flat_map(|w| w.misjudged.iter().copied())
        .collect();
    let last_restart = outages.last().map_or(Duration::ZERO, |&(_, to)| to);
    let grants_after_restart = holds.iter().filter(|h| h.granted > last_restart).count();

    // Summary.
    let count = |op: Op, status: u16| {
        calls
            .iter()
            .filter(|c| c.op == op && c.status == status)
            .count()
    };
    let acquires = calls.iter().filter(|c| c.op == Op::Acquire).count();
    let waited_409 = calls
        .iter()
        .filter(|c| c.op == Op::Acquire && c.status == 409 && c.wait_ms > 0)
        .count();
    let all_503 = calls.iter().filter(|c| c.status == 503).count();
    let paused = holds.iter().filter(|h| h.paused).count();
    let overran = holds
        .iter()
        .filter(|h| !h.paused && h.released >= h.expires)
        .count();
    let dead_on_arrival = holds.iter().filter(|h| h.dead_on_arrival()).count();
    let live_release_refused = holds
        .iter()
        .filter(|h| h.released < h.expires && matches!(h.release_status, 404 | 409))
        .count();
    let max_fence = holds.iter().map(|h| h.fence).max().unwrap_or(0);
    println!(
        "torture summary: {secs} of load, {clients} clients, {names} names, seed {seed}: \
         {acquires} acquires, {grants} grants ({g200} of them 200), max fence {max_fence}, \
         {c409} 409s ({waited_409} after a wait), {all_503} 503s ({excused_by_stalls} outside an outage but during a \
         Redis stall), {paused} pauses, \
         {overran} unpaused holds overran their lease, {dead_on_arrival} grants arrived after \
         their lease end; writes {accepted} accepted / {refused} refused ({refused_paused} by \
         paused holders, {refused_overran} by overrunning ones), {accepted_stale} stale writes \
         accepted (nobody newer had written); releases {r204} 204 / {r404} 404 / {r409} 409 \
         ({live_release_refused} of them sent before the lease end); {restarts} Redis restarts \
         (outages {outages:?}), {grants_after_restart} grants after the last one; \
         clients done at {done}",
        secs = secs(params.load),
        clients = params.clients,
        names = params.names,
        seed = params.seed,
        grants = holds.len(),
        g200 = count(Op::Acquire, 200),
        c409 = count(Op::Acquire, 409),
        accepted = sum(|w| w.accepted),
        refused = sum(|w| w.refused),
        refused_paused = sum(|w| w.refused_paused),
        refused_overran = sum(|w| w.refused_overran),
        accepted_stale = sum(|w| w.accepted_stale),
        r204 = count(Op::Release, 204),
        r404 = count(Op::Release, 404),
        r409 = count(Op::Release, 409),
        restarts = outages.len(),
        outages = outages
            .iter()
            .map(|&(from, to)| format!("{}..{}", secs(from), secs(to)))
            .collect::<Vec<_>>(),
        done = secs(clients_done),
    );

    println!("torture latencies: {}", latencies(&calls));
    let stall_list = redis_stalls
        .iter()
        .map(|s| format!("{} {} ms ending ~{}s", s.event, s.ms, s.ended.as_secs()))
        .collect::<Vec<_>>();
    println!("torture redis stalls (latency monitor, >= {STALL_THRESHOLD_MS} ms): {stall_list:?}");

    let mut failures = Vec::new();
    if !fence_disorder.is_empty() {
        failures.push(format!(
            "{} fences did not increase in grant order (earlier, later):{}",
            fence_disorder.len(),
            listing(&fence_disorder, 10)
        ));
    }
    if !overlaps.is_empty() {
        failures.push(format!(
            "{} pairs of holders held a lock at once:{}",
            overlaps.len(),
            listing(&overlaps, 10)
        ));
    }
    if !live_refused.is_empty() {
        failures.push(format!(
            "{} writes by holders still within their lease were refused:{}",
            live_refused.len(),
            listing(&live_refused, 10)
        ));
    }
    if !misjudged.is_empty() {
        failures.push(format!(
            "the resource misjudged {} writes:{}",
            misjudged.len(),
            listing(&misjudged, 10)
        ));
    }
    if sum(|w| w.refused_paused + w.refused_overran) == 0 {
        failures.push("no stale write was refused: the run did not exercise fencing".into());
    }
    if !server_errors.is_empty() {
        failures.push(format!(
            "{} 5xx answers (or no answer) outside a Redis outage {outages:?} \
             (Redis stalls: {stall_list:?}):{}",
            server_errors.len(),
            listing(&server_errors, 20)
        ));
    }
    if !odd_statuses.is_empty() {
        failures.push(format!(
            "{} unexpected statuses:{}",
            odd_statuses.len(),
            listing(&odd_statuses, 20)
        ));
    }
    if !lost_early.is_empty() {
        failures.push(format!(
            "{} releases refused although answered within the lease:{}",
            lost_early.len(),
            listing(&lost_early, 10)
        ));
    }
    if !bad_expiries.is_empty() {
        failures.push(format!(
            "{} grants with an expires_at outside their round trip plus TTL:{}",
            bad_expiries.len(),
            listing(&bad_expiries, 10)
        ));
    }
    if !leftovers.is_empty() {
        failures.push(format!(
            "keys left in Redis after every lease ran out: {leftovers:?}"
        ));
    }
    if params.restarts > 0 && grants_after_restart == 0 {
        failures.push("no grant after the last Redis restart".into());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------
// The checker can fail
// ---------------------------------------------------------------------------

#[cfg(test)]
mod checker {
    use super::*;

    /// A hold of name 0, from `granted` to `released`, with its lease ending
    /// at `expires` (all in ms).
    fn hold(client: usize, fence: u64, granted: u64, released: u64, expires: u64) -> Hold {
        Hold {
            name: 0,
            client,
            fence,
            ttl: ms(200),
            requested: ms(granted.saturating_sub(1)),
            granted: ms(granted),
            expires: ms(expires),
            paused: false,
            released: ms(released),
            release_answered: ms(released + 1),
            release_status: 204,
        }
    }

    fn write(fence: u64, at: u64, expires: u64, accepted: bool) -> Write {
        Write {
            client: 0,
            fence,
            at: ms(at),
            expires: ms(expires),
            paused: false,
            accepted,
        }
    }

    fn call(status: u16, problem: &str, start: u64, end: u64) -> Call {
        Call {
            op: Op::Acquire,
            name: 0,
            client: 0,
            wait_ms: 0,
            start: ms(start),
            end: ms(end),
            status,
            problem: Some(problem.to_owned()),
        }
    }

    #[test]
    fn the_overlap_checker_flags_two_holders_at_once_and_nothing_else() {
        let a = hold(1, 1, 0, 50, 200);
        let b = hold(2, 2, 60, 100, 260);
        assert!(overlapping_holds(&[a, b]).is_empty());
        // C is granted while A still holds (and still within its lease).
        let c = hold(3, 3, 40, 70, 240);
        assert_eq!(overlapping_holds(&[b, a, c]), [(a, c), (c, b)]);
        // A long hold overlapping a later one, past one in between.
        let long = hold(4, 4, 0, 150, 200);
        assert_eq!(overlapping_holds(&[long, a, b]).len(), 2);
        // A paused holder counts only up to its lease end.
        let paused = Hold {
            paused: true,
            ..hold(5, 5, 0, 400, 50)
        };
        assert!(overlapping_holds(&[paused, b]).is_empty());
        // Other names do not collide.
        let elsewhere = Hold { name: 1, ..c };
        assert!(overlapping_holds(&[a, elsewhere]).is_empty());
    }

    #[test]
    fn the_fence_checker_flags_a_decrease_or_a_repeat_in_grant_order() {
        let a = hold(1, 7, 0, 10, 200);
        let b = hold(2, 8, 20, 30, 220);
        assert!(fence_order_violations(&[b, a]).is_empty());
        let back = hold(3, 5, 40, 50, 240);
        assert_eq!(fence_order_violations(&[a, b, back]), [(b, back)]);
        let again = hold(3, 8, 40, 50, 240);
        assert_eq!(fence_order_violations(&[a, b, again]), [(b, again)]);
        // A grant whose lease ran out before its 201 arrived is left out.
        let late = hold(3, 5, 40, 50, 35);
        assert!(late.dead_on_arrival());
        assert!(fence_order_violations(&[a, b, late]).is_empty());
    }

    #[test]
    fn the_write_checker_flags_a_refused_live_write_and_counts_stale_ones() {
        let log = [
            write(1, 10, 200, true),
            write(3, 20, 200, true),
            // Fence 2 after 3: refused; its writer's lease ended at 15.
            write(2, 30, 15, false),
            write(4, 40, 200, true),
        ];
        let check = check_writes(&log);
        assert_eq!((check.accepted, check.refused), (3, 1));
        assert_eq!(check.refused_overran, 1);
        assert!(check.live_refused.is_empty() && check.misjudged.is_empty());

        // Same, but the writer of fence 2 still held its lease.
        let live = write(2, 30, 300, false);
        let check = check_writes(&[log[0], log[1], live]);
        assert_eq!(check.live_refused, [live]);

        // A resource that accepted a stale fence, or refused a fresh one.
        let wrong = [
            write(3, 10, 200, true),
            write(2, 20, 10, true),
            write(5, 30, 200, false),
        ];
        assert_eq!(check_writes(&wrong).misjudged, [wrong[1], wrong[2]]);
    }

    #[test]
    fn the_server_error_checker_allows_only_503_unavailable_during_an_outage() {
        let outages = [(ms(1000), ms(1800))];
        let ok = [
            call(503, "backend-unavailable", 900, 1001),
            call(503, "backend-unavailable", 1500, 1510),
            call(503, "backend-unavailable", 1799, 2500),
            call(409, "lock-held", 0, 1),
        ];
        assert!(unexpected_server_errors(&ok, &outages).is_empty());
        let bad = [
            call(503, "backend-unavailable", 1801, 1900),
            call(503, "backend-unavailable", 100, 999),
            call(503, "timeout", 1500, 1510),
            call(500, "internal", 1500, 1510),
            call(0, "no answer", 1500, 1510),
        ];
        assert_eq!(unexpected_server_errors(&bad, &outages).len(), bad.len());
        // A stall of 1.5 s that Redis stamped with second 7 (it ended within
        // [7 s, 8 s)) excuses a 503 from 5.6 s to 8.3 s, give or take.
        let stall = Stall {
            event: "aof-fsync-always".into(),
            ended: ms(7000),
            ms: 1500,
        };
        assert_eq!(stall.window(), (ms(5500), ms(8300)));
        let during = call(503, "backend-unavailable", 5600, 6600);
        let after = call(503, "backend-unavailable", 8400, 9400);
        assert_eq!(
            unexpected_server_errors(&[during, after.clone()], &[stall.window()])
                .iter()
                .map(|c| c.start)
                .collect::<Vec<_>>(),
            [after.start]
        );
        assert_eq!(
            unexpected_statuses(&[call(400, "invalid-request", 0, 1)]).len(),
            1
        );
    }

    #[test]
    fn the_expiry_check_flags_a_lease_end_outside_the_round_trip() {
        // Requested at 99, granted at 100, TTL 200: the lease ends in
        // [299, 300], give or take the tolerance.
        let fine = hold(1, 1, 100, 110, 299);
        let early = hold(1, 1, 100, 110, 290);
        let late = hold(1, 1, 100, 110, 310);
        assert_eq!(implausible_expiries(&[fine, early, late]), [early, late]);
    }

    #[test]
    fn a_release_refused_within_the_lease_is_a_lock_lost_early() {
        let fine = hold(1, 1, 0, 50, 200);
        let gone = Hold {
            release_status: 404,
            ..fine
        };
        let taken = Hold {
            release_status: 409,
            ..fine
        };
        // Sent before the lease end, answered after it: nothing to say.
        let late = Hold {
            release_answered: ms(210),
            ..gone
        };
        assert_eq!(locks_lost_early(&[fine, gone, taken, late]), [gone, taken]);
    }

    #[test]
    fn leftover_keys_are_everything_but_fence_counters_histories_and_lapsed_holders() {
        let key = |k: &str, pttl: i64| (k.to_owned(), pttl);
        let keys = [
            key("lockd:{a}:fence", 3_000),
            key("lockd:{a}:history", 3_000),
            key("lockd:{b}:meta", 2_000),
            key("lockd:{a}", 1_000),
            key("lockd:{a}:meta", 2_000),
            key("lockd:{c}:meta", -1),
            key("lockd:{d}:meta", 5_000),
            key("other", -1),
        ];
        assert_eq!(
            leftover_keys(&keys, 3_000),
            [
                "lockd:{a}",
                "lockd:{a}:meta",
                "lockd:{c}:meta",
                "lockd:{d}:meta",
                "other"
            ]
        );
    }
}
