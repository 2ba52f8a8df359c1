//! Shared harness of the integration tests, one module per concern:
//! `redis_server` (real servers), `tls_redis` (a private CA and real
//! servers that speak TLS only), `cluster` (a Redis Cluster shared by the
//! binary's tests), `sentinel` (a master, replicas and Sentinels), `proxy` (a faulty link), `app` (lockd
//! in-process, and [`backend_tests!`]), `process` (the `lockd` binary),
//! `replies` (HTTP answers), `events` (a watch's Server-Sent Events) and
//! `metrics` (Prometheus text). Everything is
//! re-exported here, so a test file writes `use crate::support::...`.
//!
//! Every test gets its own world: a real `redis-server` on a free loopback
//! port ([`RedisServer`]), or several for Redlock, and a lockd built
//! in-process on port 0 ([`TestApp`]), or a lockd over the in-memory backend.
//! Tests drive lockd over HTTP, as a client would, and look at the store
//! directly through backend-neutral probes ([`TestApp::holder`],
//! [`TestApp::lock_key_count`]; Redlock tests read each node instead) to
//! check what was (or was not) written.
//!
//! - [`RedisServer`] spawns `redis-server` with no persistence in a temporary
//!   directory, waits until it answers `PING`, and kills it on drop. It can
//!   be stopped and started again on the same port, or frozen with SIGSTOP,
//!   for outage tests (a restart checks that the server answering is the new
//!   process, not another test's server on the freed port).
//!   [`RedisServer::spawn_persistent`] runs it with AOF and `appendfsync
//!   always` instead, as docs/design.md recommends: a restart (SIGKILL, then
//!   start again on the same port and directory) keeps every acknowledged
//!   write.
//!   [`RedisServer::cmd`] runs a raw command.
//!   [`RedisServer::set_lock`], [`RedisServer::lock_token`] and friends read
//!   and write one lock's keys on that server directly, as another client
//!   would.
//! - [`TestCa`] is a certificate authority made with rcgen: it signs
//!   server certificates for `127.0.0.1` ([`ServerCert`]: good, expired,
//!   or for another name) and client certificates, as PEM files
//!   ([`IssuedCert`]). [`TlsRedisServer`] runs `redis-server` with
//!   `--port 0 --tls-port PORT` (no plain port at all) and one of those
//!   certificates, trusting a CA's client certificates and, with
//!   `auth_clients`, requiring one; [`TlsRedisServer::cli`] runs
//!   `redis-cli` on it over TLS (trusting any certificate, so that it
//!   reaches a server lockd must refuse). [`TlsCluster`] joins three of
//!   them into a Redis Cluster (the bus over TLS too), of its test's own.
//! - [`LinkProxy`] is a TCP proxy in front of one server: it delays each
//!   direction, and can freeze the link (bytes are held, in order, until it
//!   thaws) as soon as the client sends a given command, or the server a
//!   given answer. It makes a slow node, a node that hangs with a command
//!   in flight, or (in front of a lockd) an answer lost on its way back.
//! - [`TestApp`] builds `lockd::app::Application` exactly as `main` does
//!   (with [`lockd::config::Settings`]), serves it on a spawned task, and
//!   offers one helper per API action, returning a [`Reply`].
//!   [`TestApp::redlock`] builds lockd over N fresh redis-servers (Redlock),
//!   and [`TestApp::redlock_over`] over given servers reached at given URLs
//!   (such as proxies); [`TestApp::node`] gives each server.
//!   [`TestApp::sibling`] builds a second lockd on the same redis-server(s),
//!   to test several instances sharing one store; the servers stop when the
//!   last app using them is dropped. [`TestApp::shut_down`] triggers the
//!   graceful shutdown `main` runs on SIGTERM. [`TestApp::client_with_timeout`]
//!   and [`TestApp::try_send_via`] send through a client that hangs up early.
//! - [`Lockd`] is the one guard for a run of the `lockd` binary (`serve`
//!   or a client subcommand): [`lockd`] clears the environment to an
//!   allow-list, the guard writes stdout and stderr to files and kills lockd
//!   (and the process group of a command it runs) on drop; [`run`] bounds a
//!   run to [`LIMIT`].
//! - [`backend_tests!`] turns each `async fn name(app: &TestApp)` into one
//!   `#[tokio::test]` per backend (`redis::name`, `memory::name` and
//!   `redlock::name`), so the same conformance tests run against all three. Its `mod m = tweak; ...` form
//!   builds every app with settings changed by `tweak`, in module `m`; a
//!   name may carry attributes such as `#[ignore = "bug: ..."]`.
//!   [`redis_and_memory_tests!`] does the same over `redis` and `memory`
//!   only, for the kinds of lease Redlock refuses.
//!
//! Set `TEST_LOG=1` (or a filter such as `TEST_LOG=lockd=debug`) to see lockd's logs while a test runs (with
//! `cargo test -- --nocapture`; libtest captures them otherwise).

mod app;
mod cluster;
mod events;
mod metrics;
mod process;
mod proxy;
mod redis_server;
mod replies;
mod sentinel;
mod tls_redis;

pub use app::*;
pub use cluster::*;
pub use events::*;
pub use metrics::*;
pub use process::*;
pub use proxy::*;
pub use redis_server::*;
pub use replies::*;
pub use sentinel::*;
pub use tls_redis::*;

use std::net::TcpListener;
use std::time::{Duration, Instant};

/// Polls `check` every 10 ms, up to `within`, until it holds; returns
/// whether it did.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// A valid client token that nobody uses (32 characters, like lockd's).
pub fn random_token() -> String {
    use base64::Engine as _;
    let bytes: [u8; 24] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Milliseconds since `at`, for bounds that allow the time a test took.
pub fn ms_since(at: std::time::Instant) -> i64 {
    i64::try_from(at.elapsed().as_millis()).expect("fits")
}

/// Milliseconds from now until an RFC 3339 time (negative when past).
pub fn ms_until(rfc3339: &str) -> i64 {
    let t = humantime::parse_rfc3339(rfc3339)
        .unwrap_or_else(|e| panic!("{rfc3339:?} is not RFC 3339: {e}"));
    let now = std::time::SystemTime::now();
    match t.duration_since(now) {
        Ok(d) => i64::try_from(d.as_millis()).expect("fits"),
        Err(e) => -i64::try_from(e.duration().as_millis()).expect("fits"),
    }
}

/// One `[[keys]]` entry of a keys file for `secret`, written as
/// `lockd keygen` writes it.
pub fn key_entry(
    id: &str,
    secret: &str,
    prefixes: &[&str],
    permissions: &[lockd::auth::Permission],
    requests_per_second: Option<u32>,
) -> String {
    lockd::auth::KeyEntry {
        id: id.to_owned(),
        secret_sha256: lockd::auth::secret_sha256(secret),
        prefixes: prefixes.iter().map(|p| (*p).to_owned()).collect(),
        permissions: permissions.to_vec(),
        requests_per_second,
    }
    .to_toml()
}
