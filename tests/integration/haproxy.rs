//! lockd replicas behind haproxy, with the example configuration itself
//! (`deploy/haproxy/haproxy.cfg`, docs/deploy.md): two `lockd serve`
//! replicas on one Redis, haproxy in front of them.
//!
//! - A lock taken through haproxy is extended and released through it
//!   after the replica that granted it is killed, at once (haproxy passes
//!   the dead replica over before its health check notices); with no
//!   replica left, haproxy answers 503 as a problem document with
//!   `Retry-After`.
//! - A replica that loses Redis (its `/readyz` turns 503) leaves the
//!   rotation, and comes back when Redis does.
//! - A replica stopped with SIGTERM under load loses no request.
//!
//! haproxy must be installed (`scripts/ensure-deps.sh haproxy`;
//! scripts/test.sh does it): these tests fail without it, they do not
//! skip.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::{LinkProxy, Lockd, RedisServer, eventually, free_port};

/// The example configuration under test.
const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/haproxy/haproxy.cfg");

/// How long haproxy may take to see a replica come up or go down.
const CHECK_LIMIT: Duration = Duration::from_secs(15);

/// The haproxy binary: on PATH, or in the sbin directories that are not on
/// every user's PATH.
fn haproxy_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("haproxy"))
        .find(|bin| bin.is_file())
        .unwrap_or_else(|| {
            panic!("haproxy is not installed; `scripts/ensure-deps.sh haproxy` installs it")
        })
}

/// haproxy running `deploy/haproxy/haproxy.cfg` in front of some
/// replicas, on free loopback ports; killed on drop.
struct Haproxy {
    child: Child,
    log: tempfile::NamedTempFile,
    port: u16,
    stats_port: u16,
    http: reqwest::Client,
}

impl Haproxy {
    /// Starts haproxy in front of `replicas` (`host:port`; one to three)
    /// and waits until each has passed a health check.
    async fn start(replicas: &[&str]) -> Self {
        let binary = haproxy_binary();
        for _ in 0..3 {
            let (port, stats_port) = (free_port(), free_port());
            let log = tempfile::NamedTempFile::new().expect("haproxy's log file");
            let mut cmd = Command::new(&binary);
            cmd.args(["-db", "-f", CONFIG])
                .env("LOCKD_REPLICAS", replicas.len().to_string())
                .env("LOCKD_HAPROXY_BIND", format!("127.0.0.1:{port}"))
                .env("LOCKD_HAPROXY_STATS", format!("127.0.0.1:{stats_port}"))
                .stdin(Stdio::null())
                .stdout(log.reopen().expect("log file"))
                .stderr(log.reopen().expect("log file"));
            for (i, addr) in replicas.iter().enumerate() {
                cmd.env(format!("LOCKD_REPLICA_{}", i + 1), addr);
            }
            let mut haproxy = Self {
                child: cmd.spawn().expect("spawn haproxy"),
                log,
                port,
                stats_port,
                http: reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .expect("a client"),
            };
            let names: Vec<String> = (1..=replicas.len()).map(|i| format!("lockd{i}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let deadline = Instant::now() + CHECK_LIMIT;
            while Instant::now() < deadline {
                if haproxy.child.try_wait().expect("poll haproxy").is_some() {
                    break;
                }
                if haproxy.states().await.is_some_and(|s| {
                    names
                        .iter()
                        .all(|n| s.iter().any(|(name, state)| name == n && *state == Up))
                }) {
                    return haproxy;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let log = haproxy.log();
            // Another test took a port first: try others.
            if log.contains("cannot bind socket") {
                continue;
            }
            panic!("haproxy did not bring {names:?} up within {CHECK_LIMIT:?}:\n{log}");
        }
        panic!("haproxy found no free ports in 3 tries");
    }

    /// `http://127.0.0.1:<haproxy's port><path>`.
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Everything haproxy logged so far (one line per request, and its
    /// health check changes).
    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Each server of backend `lockd` with its state; `None` while the
    /// stats do not answer.
    async fn states(&self) -> Option<Vec<(String, State)>> {
        let csv = self
            .http
            .get(format!("http://127.0.0.1:{}/;csv", self.stats_port))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        Some(
            csv.lines()
                .map(|line| line.split(',').collect::<Vec<_>>())
                .filter(|f| f.len() > 36 && f[0] == "lockd" && f[1].starts_with("lockd"))
                .map(|f| {
                    let state = match (f[17], f[36]) {
                        ("UP", "L7OK") => Up,
                        ("DOWN", _) => Down,
                        // Going up or down ("UP 1/2"), or not checked yet.
                        _ => Changing,
                    };
                    (f[1].to_owned(), state)
                })
                .collect(),
        )
    }

    /// Waits until haproxy has server `name` in `state`.
    async fn wait_for(&self, name: &str, state: State) {
        let deadline = Instant::now() + CHECK_LIMIT;
        while Instant::now() < deadline {
            let states = self.states().await.unwrap_or_default();
            if states.iter().any(|(n, s)| n == name && *s == state) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "haproxy did not have {name} {state:?} within {CHECK_LIMIT:?}:\n{}",
            self.log()
        );
    }
}

/// What haproxy makes of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the rotation, its last health check passed.
    Up,
    /// Out of the rotation.
    Down,
    /// Between the two (`fall 2 rise 2`), or not checked yet.
    Changing,
}
use State::{Changing, Down, Up};

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `lockd serve` on `redis_url`.
async fn replica(redis_url: &str) -> Lockd {
    Lockd::serve(&["--redis-url", redis_url], &[]).await
}

/// Whether `replica` logged the request with ID `id`.
fn logged(replica: &Lockd, id: &str) -> bool {
    replica.stderr().contains(&format!("request_id=\"{id}\""))
}

/// Which of `replicas` logged the request with ID `id` (lockd writes its
/// access line as it answers, so it may land just after the answer).
async fn served_by(replicas: &[&Lockd], id: &str) -> usize {
    let mut by = None;
    eventually(Duration::from_secs(5), || {
        by = replicas.iter().position(|r| logged(r, id));
        async move { by.is_some() }
    })
    .await;
    by.unwrap_or_else(|| panic!("no replica logged request {id}"))
}

/// The `x-request-id` lockd answered with.
fn request_id(reply: &reqwest::Response) -> String {
    reply
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .expect("lockd answers with x-request-id")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_outlives_the_replica_that_granted_it() {
    let redis = RedisServer::spawn().await;
    let mut replicas = [replica(&redis.url()).await, replica(&redis.url()).await];
    let haproxy = Haproxy::start(&[replicas[0].addr(), replicas[1].addr()]).await;
    let http = reqwest::Client::new();

    let granted = http
        .post(haproxy.url("/locks/through-haproxy?ttl_ms=30000"))
        .send()
        .await
        .unwrap();
    assert_eq!(granted.status(), 201, "{}", haproxy.log());
    let id = request_id(&granted);
    let token = granted.json::<serde_json::Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let granter = served_by(&[&replicas[0], &replicas[1]], &id).await;
    replicas[granter].signal(Signal::SIGKILL);
    let _ = replicas[granter].wait(Duration::from_secs(10)).await;

    // At once, before haproxy's health check has seen it go: every
    // request is passed over to the replica left (leastconn would give
    // every other one to the dead replica).
    for _ in 0..10 {
        let held = http
            .get(haproxy.url("/locks/through-haproxy"))
            .send()
            .await
            .unwrap();
        assert_eq!(held.status(), 200, "{}", haproxy.log());
    }
    let extended = http
        .patch(haproxy.url("/locks/through-haproxy?ttl_ms=20000"))
        .header("Lock-Token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(extended.status(), 200, "{}", haproxy.log());
    let by = served_by(&[&replicas[0], &replicas[1]], &request_id(&extended)).await;
    assert_eq!(
        by,
        1 - granter,
        "the extend was served by the killed replica"
    );
    let released = http
        .delete(haproxy.url("/locks/through-haproxy"))
        .header("Lock-Token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 204, "{}", haproxy.log());
    assert_eq!(redis.lock_token("through-haproxy").await, None);
    haproxy
        .wait_for(&format!("lockd{}", granter + 1), Down)
        .await;

    // No replica left: haproxy's own 503, shaped as lockd's.
    replicas[1 - granter].signal(Signal::SIGKILL);
    haproxy
        .wait_for(&format!("lockd{}", 2 - granter), Down)
        .await;
    let refused = http
        .post(haproxy.url("/locks/through-haproxy"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(refused.headers()["retry-after"], "1");
    let problem: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(problem["status"], 503, "{problem}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_loses_redis_leaves_the_rotation_until_it_is_back() {
    let redis = RedisServer::spawn().await;
    let link = LinkProxy::start(redis.port()).await;
    let direct = replica(&redis.url()).await;
    let linked = replica(&link.url()).await;
    let haproxy = Haproxy::start(&[direct.addr(), linked.addr()]).await;
    let http = reqwest::Client::new();

    // lockd2 loses Redis: its next PING (the one /readyz sends) and
    // everything after it hang.
    link.freeze_on(b"PING");
    haproxy.wait_for("lockd2", Down).await;
    for i in 0..20 {
        let name = format!("/locks/rotation-{i}");
        let granted = http
            .post(haproxy.url(&name))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        assert_eq!(granted.status(), 201, "{}", haproxy.log());
        let by = served_by(&[&direct, &linked], &request_id(&granted)).await;
        assert_eq!(by, 0, "served by lockd2, which has lost Redis");
    }

    link.thaw();
    haproxy.wait_for("lockd2", Up).await;
    let mut by_linked = 0;
    for i in 0..20 {
        let reply = http
            .get(haproxy.url(&format!("/locks/rotation-{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 200);
        by_linked += served_by(&[&direct, &linked], &request_id(&reply)).await;
    }
    assert!(by_linked > 0, "lockd2 got no request once back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopped_under_load_loses_no_request() {
    let redis = RedisServer::spawn().await;
    let stays = replica(&redis.url()).await;
    let mut stops = replica(&redis.url()).await;
    let haproxy = Arc::new(Haproxy::start(&[stays.addr(), stops.addr()]).await);
    let http = reqwest::Client::new();
    let done = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicUsize::new(0));

    // 16 clients take and release locks of their own through haproxy,
    // over keep-alive connections, until told to stop.
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let (http, haproxy, done, cycles) =
                (http.clone(), haproxy.clone(), done.clone(), cycles.clone());
            tokio::spawn(async move {
                let mut failures = Vec::new();
                let lock = format!("/locks/under-load-{i}");
                let acquire = haproxy.url(&format!("{lock}?ttl_ms=10000"));
                while !done.load(Ordering::SeqCst) {
                    let granted = match http.post(&acquire).send().await {
                        Ok(reply) if reply.status() == 201 => reply,
                        Ok(reply) => {
                            failures.push(format!("acquire: {}", reply.status()));
                            break;
                        }
                        Err(e) => {
                            failures.push(format!("acquire: {e}"));
                            break;
                        }
                    };
                    let token = granted.json::<serde_json::Value>().await.unwrap()["token"]
                        .as_str()
                        .unwrap()
                        .to_owned();
                    match http
                        .delete(haproxy.url(&lock))
                        .header("Lock-Token", token)
                        .send()
                        .await
                    {
                        Ok(reply) if reply.status() == 204 => {}
                        Ok(reply) => {
                            failures.push(format!("release: {}", reply.status()));
                            break;
                        }
                        Err(e) => {
                            failures.push(format!("release: {e}"));
                            break;
                        }
                    }
                    cycles.fetch_add(1, Ordering::SeqCst);
                }
                failures
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = cycles.load(Ordering::SeqCst);
    stops.signal(Signal::SIGTERM);
    stops.wait(Duration::from_secs(15)).await.expect(0);
    haproxy.wait_for("lockd2", Down).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    done.store(true, Ordering::SeqCst);
    let mut failures = Vec::new();
    for client in clients {
        failures.extend(client.await.unwrap());
    }
    let after = cycles.load(Ordering::SeqCst);
    assert!(
        failures.is_empty(),
        "{failures:?}\nhaproxy's log (end):\n{}",
        tail(&haproxy.log(), 30)
    );
    assert!(
        before > 0 && after > before,
        "cycles: {before}, then {after}"
    );
    assert!(
        stops.stderr().contains("route=\"/locks/{name}\""),
        "the stopped replica served no lock request"
    );
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
