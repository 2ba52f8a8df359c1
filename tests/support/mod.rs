//! Shared harness of the integration tests.
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
//! - [`LinkProxy`] is a TCP proxy in front of one server: it delays each
//!   direction, and can freeze the link (bytes are held, in order, until it
//!   thaws), at once or as soon as the client sends a given command. It
//!   makes a slow node, or a node that hangs with a command in flight.
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
//! - [`backend_tests!`] turns each `async fn name(app: &TestApp)` into one
//!   `#[tokio::test]` per backend (`redis::name` and `memory::name`), so the
//!   same conformance tests run against both. Its `mod m = tweak; ...` form
//!   builds both apps with settings changed by `tweak`, in module `m`; a
//!   name may carry attributes such as `#[ignore = "bug: ..."]`.
//!
//! Set `TEST_LOG=1` to see lockd's logs while a test runs.

#![allow(dead_code)]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use lockd::app::Application;
use lockd::config::Settings;
use lockd::lock::memory::MemoryBackend;
use reqwest::header::{CONTENT_TYPE, HeaderMap};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// The key prefix lockd uses by default.
pub const PREFIX: &str = "lockd:";

/// The media type of every error answer.
pub const PROBLEM_JSON: &str = "application/problem+json";

static TRACING: LazyLock<()> = LazyLock::new(|| {
    if std::env::var_os("TEST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
            .with_test_writer()
            .try_init();
    }
});

// ---------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------

/// A real `redis-server` process on a loopback port, killed on drop.
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Mutex<Option<Child>>,
    /// Runs with AOF (`appendfsync always`) rather than no persistence.
    persistent: bool,
}

/// How long a fresh `redis-server` may take to answer `PING`.
const REDIS_START_TIMEOUT: Duration = Duration::from_secs(10);

impl RedisServer {
    /// Starts a server on a free port, retrying on a port collision. It runs
    /// without persistence (`--save '' --appendonly no`): a restart loses
    /// every key.
    pub async fn spawn() -> Self {
        Self::spawn_with(false).await
    }

    /// Starts a server that persists every write before answering it
    /// (`--appendonly yes --appendfsync always`, no RDB snapshots), as
    /// docs/design.md recommends for a single Redis. [`Self::stop`] (SIGKILL) then
    /// [`Self::start`] reloads the AOF from the same directory: locks, their
    /// leases (stored as absolute expiry times) and fence counters survive.
    pub async fn spawn_persistent() -> Self {
        Self::spawn_with(true).await
    }

    async fn spawn_with(persistent: bool) -> Self {
        for _ in 0..20 {
            let server = Self {
                port: free_port(),
                dir: tempfile::tempdir().expect("temp dir for redis-server"),
                child: Mutex::new(None),
                persistent,
            };
            match server.try_start().await {
                Ok(()) => return server,
                Err(why) => eprintln!(
                    "redis-server on port {} failed ({why}); trying another port",
                    server.port
                ),
            }
        }
        panic!("could not start redis-server on any port");
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL) and waits for it to exit. Its data is lost,
    /// unless it was started with [`Self::spawn_persistent`].
    pub fn stop(&self) {
        self.kill();
    }

    /// Starts the server again on the same port, after [`Self::stop`]. It
    /// returns once the server answers `PING` (so, for a persistent server,
    /// once it has loaded its AOF).
    pub async fn start(&self) {
        self.try_start()
            .await
            .unwrap_or_else(|why| panic!("cannot restart redis-server: {why}"));
    }

    /// How the server process ended, if it ended by itself (it crashed, or
    /// something else killed it); `None` while it runs, and after
    /// [`Self::stop`].
    pub fn exit_status(&self) -> Option<std::process::ExitStatus> {
        self.child
            .lock()
            .unwrap()
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The last `lines` lines of the server's log (`redis.log` in its
    /// directory), for a failure message.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Freezes the server (SIGSTOP): it accepts connections but never answers.
    pub fn sigstop(&self) {
        self.signal("-STOP");
    }

    /// Thaws a server frozen by [`Self::sigstop`].
    pub fn sigcont(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self
            .child
            .lock()
            .unwrap()
            .as_ref()
            .expect("redis-server is running")
            .id();
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {pid} failed");
    }

    fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    async fn try_start(&self) -> Result<(), String> {
        assert!(
            self.child.lock().unwrap().is_none(),
            "redis-server already running"
        );
        let log = std::fs::File::create(self.dir.path().join("redis.log"))
            .map_err(|e| format!("log file: {e}"))?;
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(if self.persistent {
                ["--appendonly", "yes", "--appendfsync", "always"].as_slice()
            } else {
                ["--appendonly", "no"].as_slice()
            })
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot spawn redis-server: {e}"))?;
        *self.child.lock().unwrap() = Some(child);
        let deadline = Instant::now() + REDIS_START_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child.lock().unwrap().take();
                return Err(format!("redis-server exited: {status}"));
            }
            if self.ping().await {
                // After a restart the port was free for a while: make sure
                // the server answering is ours, not one another test started
                // on the port meanwhile.
                let ours = self.child.lock().unwrap().as_ref().map(Child::id);
                if self.process_id().await == ours {
                    return Ok(());
                }
                self.kill();
                return Err("another server answers on this port".into());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err("no PONG in time".into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            return false;
        };
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .is_ok_and(|p| p == "PONG")
    }

    /// The `process_id` that the server on this port reports.
    async fn process_id(&self) -> Option<u32> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
    }

    /// A fresh connection (a new one each time, so that it survives restarts).
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("valid redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test redis-server")
    }

    /// Runs one raw command, e.g. `redis.cmd::<i64>(redis::cmd("PTTL").arg(k))`.
    pub async fn cmd<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut conn = self.connection().await;
        cmd.query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("redis command failed: {e}"))
    }

    /// How many clients have a pattern subscription (`psub` > 0 in `CLIENT
    /// LIST`): each lockd instance keeps one for its release events.
    pub async fn pattern_subscribers(&self) -> usize {
        let list: String = self.cmd(redis::cmd("CLIENT").arg("LIST")).await;
        list.lines()
            .filter(|l| {
                l.split(' ')
                    .any(|f| f.strip_prefix("psub=").is_some_and(|n| n != "0"))
            })
            .count()
    }

    /// Every key in the database, sorted.
    pub async fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.cmd(redis::cmd("KEYS").arg("*")).await;
        keys.sort();
        keys
    }

    /// The value and PTTL of `key` read atomically (`None` when absent).
    pub async fn get_with_pttl(&self, key: &str) -> Option<(String, i64)> {
        let mut conn = self.connection().await;
        let (value, pttl): (Option<String>, i64) = redis::pipe()
            .atomic()
            .cmd("GET")
            .arg(key)
            .cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("GET and PTTL");
        value.map(|v| (v, pttl))
    }

    /// The PTTL of `key`: -2 when absent, -1 when it has no TTL.
    pub async fn pttl(&self, key: &str) -> i64 {
        self.cmd(redis::cmd("PTTL").arg(key)).await
    }

    /// Resets `INFO commandstats`.
    pub async fn reset_stats(&self) {
        let _: () = self.cmd(redis::cmd("CONFIG").arg("RESETSTAT")).await;
    }

    /// How many scripts (`EVAL`, `EVALSHA`) ran since [`Self::reset_stats`]:
    /// every lock operation of lockd is a script.
    pub async fn script_calls(&self) -> u64 {
        let info: String = self.cmd(redis::cmd("INFO").arg("commandstats")).await;
        info.lines()
            .filter(|l| l.starts_with("cmdstat_eval:") || l.starts_with("cmdstat_evalsha:"))
            .map(|l| {
                l.split(['=', ','])
                    .nth(1)
                    .and_then(|n| n.parse::<u64>().ok())
                    .expect("calls=N in commandstats")
            })
            .sum()
    }
}

impl RedisServer {
    /// Writes lock `name` as another client holding it under `token` would:
    /// the lock key with a lease of `px_ms`, and no metadata.
    pub async fn set_lock(&self, name: &str, token: &str, px_ms: u64) {
        let _: () = self
            .cmd(
                redis::cmd("SET")
                    .arg(lock_key(name))
                    .arg(token)
                    .arg("PX")
                    .arg(px_ms),
            )
            .await;
    }

    /// Writes lock `name` as another lockd-compatible client would (see the
    /// data model in `src/lock/redis.rs`): the lock key under `token` and
    /// its metadata hash with `fence` and `owner`, both with a lease of
    /// `px_ms`.
    pub async fn set_lock_with_meta(
        &self,
        name: &str,
        token: &str,
        fence: u64,
        owner: &str,
        px_ms: u64,
    ) {
        let meta = format!("{}:meta", lock_key(name));
        let mut conn = self.connection().await;
        let _: () = redis::pipe()
            .atomic()
            .cmd("SET")
            .arg(lock_key(name))
            .arg(token)
            .arg("PX")
            .arg(px_ms)
            .ignore()
            .cmd("DEL")
            .arg(&meta)
            .ignore()
            .cmd("HSET")
            .arg(&meta)
            .arg("fence")
            .arg(fence)
            .arg("owner")
            .arg(owner)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&meta)
            .arg(px_ms)
            .ignore()
            .query_async(&mut conn)
            .await
            .expect("write a lock");
    }

    /// Deletes lock `name` (its key and metadata), as its lease running out
    /// would.
    pub async fn drop_lock(&self, name: &str) {
        let _: () = self
            .cmd(
                redis::cmd("DEL")
                    .arg(lock_key(name))
                    .arg(format!("{}:meta", lock_key(name))),
            )
            .await;
    }

    /// The token under which lock `name` is held on this server, if any.
    pub async fn lock_token(&self, name: &str) -> Option<String> {
        self.cmd(redis::cmd("GET").arg(lock_key(name))).await
    }

    /// Whether lock `name` has a metadata hash on this server.
    pub async fn has_meta(&self, name: &str) -> bool {
        let n: i64 = self
            .cmd(redis::cmd("EXISTS").arg(format!("{}:meta", lock_key(name))))
            .await;
        n == 1
    }

    /// This server's fencing counter of lock `name`, if it has one.
    pub async fn fence_counter(&self, name: &str) -> Option<u64> {
        self.cmd(redis::cmd("GET").arg(format!("{}:fence", lock_key(name))))
            .await
    }

    /// The fence the holder of `name` was granted, from its metadata hash.
    pub async fn holder_fence(&self, name: &str) -> Option<u64> {
        self.cmd(
            redis::cmd("HGET")
                .arg(format!("{}:meta", lock_key(name)))
                .arg("fence"),
        )
        .await
    }

    /// Deletes every key (`FLUSHALL`): the server loses its data but keeps
    /// running.
    pub async fn flushall(&self) {
        let _: () = self.cmd(&redis::cmd("FLUSHALL")).await;
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

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

/// The Redis key of lock `name`.
pub fn lock_key(name: &str) -> String {
    format!("{PREFIX}{{{name}}}")
}

// ---------------------------------------------------------------------------
// A TCP link with faults
// ---------------------------------------------------------------------------

/// A TCP proxy on a loopback port in front of one server, to put faults on
/// the link between lockd and that server. Each direction is a delay line:
/// every chunk read is written [`Self::set_delay`] later, in order, so the
/// delay adds latency without limiting throughput. A frozen link holds every
/// byte, in order, until [`Self::thaw`]: a network partition that heals
/// with the data delivered late, which a SIGSTOP of the server cannot make
/// once a command is in flight. Stops on drop.
pub struct LinkProxy {
    port: u16,
    state: Arc<LinkState>,
    accept: JoinHandle<()>,
}

struct LinkState {
    upstream: u16,
    delay_ms: AtomicU64,
    frozen: watch::Sender<bool>,
    /// Freeze the link as soon as the client sends a chunk containing this.
    freeze_on: Mutex<Option<Vec<u8>>>,
}

impl LinkProxy {
    /// A proxy to `127.0.0.1:<upstream>`, with no delay.
    pub async fn start(upstream: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let state = Arc::new(LinkState {
            upstream,
            delay_ms: AtomicU64::new(0),
            frozen: watch::Sender::new(false),
            freeze_on: Mutex::new(None),
        });
        let accept_state = state.clone();
        let accept = tokio::spawn(async move {
            // Dropping the set (when this task is aborted) ends every link.
            let mut links = tokio::task::JoinSet::new();
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                links.spawn(Self::link(client, accept_state.clone()));
                while links.try_join_next().is_some() {}
            }
        });
        Self {
            port,
            state,
            accept,
        }
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Delays every chunk, in each direction, by `delay` from now on.
    pub fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).expect("delay fits");
        self.state.delay_ms.store(ms, AtomicOrdering::SeqCst);
    }

    /// Freezes the link as soon as the client sends a chunk containing
    /// `needle` (such as `b"EVAL"`, a script call); that chunk is held too.
    pub fn freeze_on(&self, needle: &[u8]) {
        *self.state.freeze_on.lock().unwrap() = Some(needle.to_vec());
    }

    /// Freezes the link now.
    pub fn freeze(&self) {
        self.state.frozen.send_replace(true);
    }

    /// Delivers everything held, in order, and lets bytes through again.
    pub fn thaw(&self) {
        *self.state.freeze_on.lock().unwrap() = None;
        self.state.frozen.send_replace(false);
    }

    /// Whether the link is frozen (for example because [`Self::freeze_on`]
    /// fired).
    pub fn is_frozen(&self) -> bool {
        *self.state.frozen.borrow()
    }

    async fn link(client: tokio::net::TcpStream, state: Arc<LinkState>) {
        let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", state.upstream)).await else {
            return; // The server is down: the client sees the link close.
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::join!(
            Self::pump(client_read, server_write, state.clone(), true),
            Self::pump(server_read, client_write, state, false),
        );
    }

    /// Copies `from` to `to` through the delay line; `to_server` says the
    /// direction (only the client's bytes can trigger [`Self::freeze_on`]).
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        state: Arc<LinkState>,
        to_server: bool,
    ) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (tx, mut rx) =
            tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
        let mut frozen = state.frozen.subscribe();
        let writer = async move {
            while let Some((due, bytes)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            let _ = to.shutdown().await;
        };
        let reader = async move {
            let mut buf = vec![0_u8; 64 * 1024];
            loop {
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let bytes = buf[..n].to_vec();
                if to_server {
                    let mut trigger = state.freeze_on.lock().unwrap();
                    if trigger
                        .as_ref()
                        .is_some_and(|needle| bytes.windows(needle.len()).any(|w| w == needle))
                    {
                        *trigger = None;
                        state.frozen.send_replace(true);
                    }
                }
                let delay = Duration::from_millis(state.delay_ms.load(AtomicOrdering::SeqCst));
                if tx
                    .send((tokio::time::Instant::now() + delay, bytes))
                    .is_err()
                {
                    break;
                }
            }
        };
        tokio::join!(reader, writer);
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

// ---------------------------------------------------------------------------
// lockd
// ---------------------------------------------------------------------------

/// The store behind a [`TestApp`], kept so tests can look at it directly.
pub enum Store {
    /// A real redis-server, shared by every [`TestApp::sibling`].
    Redis(Arc<RedisServer>),
    /// Redlock: several real redis-servers, in the order of the settings'
    /// `redis_url` (which may reach them through proxies).
    Redlock(Vec<Arc<RedisServer>>),
    /// The in-memory backend.
    Memory(Arc<MemoryBackend>),
}

/// An HTTP answer, body read as text.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
}

impl Reply {
    /// The body as JSON (panics when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| {
            panic!(
                "body of a {} is not JSON ({e}): {:?}",
                self.status, self.text
            )
        })
    }

    /// A string member of the JSON body.
    pub fn str(&self, field: &str) -> String {
        self.json()[field]
            .as_str()
            .unwrap_or_else(|| panic!("no string `{field}` in {}", self.text))
            .to_owned()
    }

    /// An integer member of the JSON body.
    pub fn u64(&self, field: &str) -> u64 {
        self.json()[field]
            .as_u64()
            .unwrap_or_else(|| panic!("no integer `{field}` in {}", self.text))
    }

    /// The token of a grant.
    pub fn token(&self) -> String {
        self.str("token")
    }

    /// The fence of a grant, extend or inspect answer.
    pub fn fence(&self) -> u64 {
        self.u64("fence")
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header").to_owned())
    }

    /// Asserts the status, with the body in the message.
    #[track_caller]
    pub fn expect_status(&self, status: u16) -> &Self {
        assert_eq!(
            self.status.as_u16(),
            status,
            "unexpected status; body: {}",
            self.text
        );
        self
    }

    /// Asserts that this is an RFC 9457 problem document with `status` and
    /// `urn:lockd:problem:<slug>`, and returns it.
    #[track_caller]
    pub fn expect_problem(&self, status: u16, slug: &str) -> Value {
        self.expect_status(status);
        let content_type = self.header("content-type").unwrap_or_default();
        assert!(
            content_type.starts_with(PROBLEM_JSON),
            "content-type {content_type:?} is not {PROBLEM_JSON}; body: {}",
            self.text
        );
        let body = self.json();
        assert_eq!(
            body["type"],
            format!("urn:lockd:problem:{slug}"),
            "{}",
            self.text
        );
        assert_eq!(body["status"], status, "{}", self.text);
        for member in ["title", "detail"] {
            assert!(
                body[member].as_str().is_some_and(|s| !s.is_empty()),
                "problem without `{member}`: {}",
                self.text
            );
        }
        body
    }
}

/// A lockd served on a loopback port, with its store.
pub struct TestApp {
    /// Where lockd listens.
    pub addr: SocketAddr,
    /// Where `/metrics` is served when `settings.metrics.listen` was set.
    pub metrics_addr: Option<SocketAddr>,
    /// An HTTP client (with a timeout, so no test can hang).
    pub client: reqwest::Client,
    /// The store lockd uses.
    pub store: Store,
    /// The settings lockd was built with.
    pub settings: Settings,
    shutdown: Mutex<Option<oneshot::Sender<()>>>,
    served: Mutex<Option<JoinHandle<std::io::Result<()>>>>,
}

/// The default test settings: any port, and a short Redis timeout.
fn test_settings(redis_url: String) -> Settings {
    let mut settings = Settings::default();
    settings.listen.addr = "127.0.0.1:0".parse().expect("valid address");
    settings.store.redis_urls = vec![redis_url.into()];
    // Tests that restart Redlock nodes test other things than the
    // delayed restart, which has tests of its own that turn it on.
    settings.store.redlock_restart_delay = Some(Duration::ZERO);
    settings
}

/// How much of a lease the time on the wire may take in these tests: a
/// grant or an extend reports the TTL less the time since lockd sent the
/// script, in whole milliseconds.
pub const WIRE_SLACK_MS: u64 = 50;

/// Checks that `ttl_ms` is what is left of a lease of `asked` ms just
/// granted or extended: at most `asked`, and within [`WIRE_SLACK_MS`].
#[track_caller]
pub fn assert_lease_ms(ttl_ms: Option<u64>, asked: u64) {
    let ttl_ms = ttl_ms.expect("a ttl_ms");
    assert!(
        ttl_ms <= asked && ttl_ms + WIRE_SLACK_MS >= asked,
        "ttl_ms {ttl_ms} for a lease of {asked} ms"
    );
}

impl TestApp {
    /// lockd over a fresh redis-server.
    pub async fn redis() -> Self {
        Self::redis_with(|_| {}).await
    }

    /// lockd over a fresh redis-server, with settings changed by `tweak`.
    pub async fn redis_with(tweak: impl FnOnce(&mut Settings)) -> Self {
        let server = Arc::new(RedisServer::spawn().await);
        Self::redis_on(server, tweak).await
    }

    /// Another lockd on the same redis-server as `self` (which must use
    /// Redis), with settings changed by `tweak`: two instances sharing one
    /// Redis, as in a deployment.
    pub async fn sibling(&self, tweak: impl FnOnce(&mut Settings)) -> Self {
        match &self.store {
            Store::Redis(server) => Self::redis_on(server.clone(), tweak).await,
            Store::Redlock(nodes) => {
                let urls = self
                    .settings
                    .store
                    .redis_urls
                    .iter()
                    .map(|u| u.expose().to_owned());
                Self::redlock_over(nodes.clone(), urls.collect(), tweak).await
            }
            Store::Memory(_) => panic!("instances share only a Redis store"),
        }
    }

    /// lockd running Redlock over `n` fresh redis-servers, with settings
    /// changed by `tweak`.
    pub async fn redlock(n: usize, tweak: impl FnOnce(&mut Settings)) -> Self {
        let nodes: Vec<Arc<RedisServer>> =
            futures::future::join_all((0..n).map(|_| RedisServer::spawn()))
                .await
                .into_iter()
                .map(Arc::new)
                .collect();
        let urls = nodes.iter().map(|node| node.url()).collect();
        Self::redlock_over(nodes, urls, tweak).await
    }

    /// lockd running Redlock over 3 fresh redis-servers, for the
    /// conformance tests of [`backend_tests!`], with settings changed by
    /// `tweak`. Its drift factor is 0: Redlock reports the validity of a
    /// lease, `ttl − elapsed − (ttl × drift_factor + 2 ms)`, and with the
    /// default 1 % a lease of 30 s would read 300 ms short, past the
    /// [`WIRE_SLACK_MS`] the conformance tests allow for the time on the
    /// wire. The drift allowance has tests of its own (`lock::redlock`).
    /// Each node gets the single Redis's timeout (`redis_timeout_ms`, not
    /// the 50 ms `node_timeout_ms`), so that a test's bursts of concurrent
    /// requests queue for the pool as they do on one Redis, rather than
    /// time out as a quorum failure.
    pub async fn redlock_conformance(tweak: impl FnOnce(&mut Settings)) -> Self {
        Self::redlock(3, |settings| {
            settings.store.drift_factor = 0.0;
            settings.store.node_timeout = settings.store.redis_timeout;
            tweak(settings);
        })
        .await
    }

    /// lockd running Redlock over `nodes`, reached at `urls` (one per node,
    /// in the same order: its own URL, or a [`LinkProxy`]'s in front of it),
    /// with settings changed by `tweak`.
    pub async fn redlock_over(
        nodes: Vec<Arc<RedisServer>>,
        urls: Vec<String>,
        tweak: impl FnOnce(&mut Settings),
    ) -> Self {
        assert_eq!(nodes.len(), urls.len(), "one URL per node");
        assert!(nodes.len() >= 2, "Redlock needs several nodes");
        LazyLock::force(&TRACING);
        let mut settings = test_settings(String::new());
        settings.store.redis_urls = urls.into_iter().map(Into::into).collect();
        tweak(&mut settings);
        let app = Application::build(&settings)
            .await
            .expect("build lockd over Redlock");
        Self::serve(app, Store::Redlock(nodes), settings)
    }

    /// The Redlock nodes, in the order of `redis_url` (panics for other
    /// stores).
    pub fn nodes(&self) -> &[Arc<RedisServer>] {
        match &self.store {
            Store::Redlock(nodes) => nodes,
            _ => panic!("this test needs the Redlock backend"),
        }
    }

    /// Redlock node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes()[i]
    }

    /// The `node` label of node `i` in lockd's metrics: `host:port` of the
    /// URL lockd uses for it.
    pub fn node_label(&self, i: usize) -> String {
        let url = self.settings.store.redis_urls[i].expose();
        url.strip_prefix("redis://")
            .unwrap_or(url)
            .trim_end_matches('/')
            .to_owned()
    }

    /// lockd over `server` (such as one from
    /// [`RedisServer::spawn_persistent`]), with settings changed by `tweak`.
    pub async fn redis_on(server: Arc<RedisServer>, tweak: impl FnOnce(&mut Settings)) -> Self {
        LazyLock::force(&TRACING);
        let mut settings = test_settings(server.url());
        tweak(&mut settings);
        let app = Application::build(&settings)
            .await
            .expect("build lockd over Redis");
        Self::serve(app, Store::Redis(server), settings)
    }

    /// lockd over the in-memory backend.
    pub async fn memory() -> Self {
        Self::memory_with(|_| {}).await
    }

    /// lockd over the in-memory backend, with settings changed by `tweak`.
    pub async fn memory_with(tweak: impl FnOnce(&mut Settings)) -> Self {
        LazyLock::force(&TRACING);
        let mut settings = test_settings("redis://127.0.0.1:1".into());
        tweak(&mut settings);
        let backend = Arc::new(MemoryBackend::new());
        let app = Application::with_backend(&settings, backend.clone())
            .await
            .expect("build lockd over memory");
        Self::serve(app, Store::Memory(backend), settings)
    }

    fn serve(app: Application, store: Store, settings: Settings) -> Self {
        let addr = app.local_addr().expect("local address");
        let metrics_addr = app.metrics_addr().expect("metrics address");
        let (tx, rx) = oneshot::channel::<()>();
        let served = tokio::spawn(app.run_until(async move {
            let _ = rx.await;
        }));
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("HTTP client");
        Self {
            addr,
            metrics_addr,
            client,
            store,
            settings,
            shutdown: Mutex::new(Some(tx)),
            served: Mutex::new(Some(served)),
        }
    }

    /// Begins the graceful shutdown, as SIGTERM does in `main`: lockd stops
    /// accepting connections, ends every wait (503 `shutting-down`) and
    /// finishes the requests in flight.
    pub fn shut_down(&self) {
        if let Some(tx) = self.shutdown.lock().unwrap().take() {
            let _ = tx.send(());
        }
    }

    /// Whether the server finished (after [`Self::shut_down`]) within
    /// `within`, without an error.
    pub async fn stopped_within(&self, within: Duration) -> bool {
        let Some(mut served) = self.served.lock().unwrap().take() else {
            return true;
        };
        match tokio::time::timeout(within, &mut served).await {
            Ok(result) => matches!(result, Ok(Ok(()))),
            Err(_) => {
                *self.served.lock().unwrap() = Some(served);
                false
            }
        }
    }

    /// An HTTP client that gives up (hangs up) after `timeout`, for use with
    /// [`Self::try_send_via`].
    pub fn client_with_timeout(timeout: Duration) -> reqwest::Client {
        reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .expect("HTTP client")
    }

    /// The Redis server (panics for the memory backend).
    pub fn redis_server(&self) -> &RedisServer {
        match &self.store {
            Store::Redis(server) => server,
            _ => panic!("this test needs the single-Redis backend"),
        }
    }

    /// Whether the store is one Redis (not Redlock, not memory).
    pub fn is_redis(&self) -> bool {
        matches!(self.store, Store::Redis(_))
    }

    /// Whether the store is Redlock over several Redis nodes.
    pub fn is_redlock(&self) -> bool {
        matches!(self.store, Store::Redlock(_))
    }

    /// How many nodes each lock operation goes to: Redlock's nodes, else 1.
    pub fn node_count(&self) -> usize {
        match &self.store {
            Store::Redlock(nodes) => nodes.len(),
            _ => 1,
        }
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Sends any request. `path` includes any query string.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Reply {
        let what = format!("{method} {path}");
        self.try_send(method, path, headers, body)
            .await
            .unwrap_or_else(|e| panic!("{what}: no HTTP answer: {e}"))
    }

    /// Like [`Self::send`], but a request that gets no HTTP answer (the
    /// connection was dropped, or it timed out) is an `Err`.
    pub async fn try_send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<Reply, reqwest::Error> {
        self.try_send_via(&self.client, method, path, headers, body)
            .await
    }

    /// Like [`Self::try_send`], through `client` (such as one from
    /// [`Self::client_with_timeout`]).
    pub async fn try_send_via(
        &self,
        client: &reqwest::Client,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<Reply, reqwest::Error> {
        let mut request = client.request(method, self.url(path));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.send().await?;
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await?;
        Ok(Reply {
            status,
            headers,
            text,
        })
    }

    /// Sends a request with an optional JSON body.
    pub async fn send_json(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> Reply {
        let body = body.map(|b| serde_json::to_vec(&b).expect("serialize JSON"));
        let mut all = headers.to_vec();
        if body.is_some() {
            all.push((CONTENT_TYPE.as_str(), "application/json"));
        }
        self.send(method, path, &all, body).await
    }

    /// `POST /locks/{name}` with an optional JSON body.
    pub async fn acquire(&self, name: &str, body: Option<Value>) -> Reply {
        self.send_json(Method::POST, &format!("/locks/{name}"), &[], body)
            .await
    }

    /// `POST /locks/{name}` with `{"ttl_ms": ttl_ms}`.
    pub async fn acquire_ttl(&self, name: &str, ttl_ms: u64) -> Reply {
        self.acquire(name, Some(serde_json::json!({ "ttl_ms": ttl_ms })))
            .await
    }

    /// `PATCH /locks/{name}` with the token in `Lock-Token` and an optional
    /// JSON body.
    pub async fn extend(&self, name: &str, token: &str, body: Option<Value>) -> Reply {
        self.send_json(
            Method::PATCH,
            &format!("/locks/{name}"),
            &[("Lock-Token", token)],
            body,
        )
        .await
    }

    /// `PATCH /locks/{name}` to `ttl_ms`.
    pub async fn extend_ttl(&self, name: &str, token: &str, ttl_ms: u64) -> Reply {
        self.extend(name, token, Some(serde_json::json!({ "ttl_ms": ttl_ms })))
            .await
    }

    /// `DELETE /locks/{name}` with the token in `Lock-Token`.
    pub async fn release(&self, name: &str, token: &str) -> Reply {
        self.send(
            Method::DELETE,
            &format!("/locks/{name}"),
            &[("Lock-Token", token)],
            None,
        )
        .await
    }

    /// `GET /locks/{name}`.
    pub async fn inspect(&self, name: &str) -> Reply {
        self.get(&format!("/locks/{name}")).await
    }

    /// `GET <path>`.
    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, &[], None).await
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        let reply = self.get("/metrics").await;
        reply.expect_status(200);
        reply.text
    }

    /// How many lock operations reached the backend so far (from
    /// `lockd_backend_duration_seconds_count`, any op but `ping`).
    pub async fn backend_calls(&self) -> u64 {
        let text = self.metrics().await;
        ["acquire", "extend", "release", "inspect"]
            .iter()
            .map(|op| {
                metric(&text, "lockd_backend_duration_seconds_count", &[("op", op)]).unwrap_or(0.0)
                    as u64
            })
            .sum()
    }

    /// Who holds `name` according to the store: the token and the remaining
    /// lease in ms (Redis: `GET` and `PTTL` of the lock key; memory: `peek`;
    /// Redlock: the token a quorum of nodes holds, with the shortest PTTL).
    pub async fn holder(&self, name: &str) -> Option<(String, i64)> {
        match &self.store {
            Store::Redis(server) => server.get_with_pttl(&lock_key(name)).await,
            // The holder by Redlock's rule: the token a quorum of nodes
            // holds, with the shortest of their leases.
            Store::Redlock(nodes) => {
                let key = lock_key(name);
                let held =
                    futures::future::join_all(nodes.iter().map(|node| node.get_with_pttl(&key)))
                        .await;
                let held: Vec<(String, i64)> = held.into_iter().flatten().collect();
                let quorum = nodes.len() / 2 + 1;
                held.iter()
                    .map(|(token, _)| token)
                    .find(|token| held.iter().filter(|(t, _)| t == *token).count() >= quorum)
                    .map(|token| {
                        let pttl = held
                            .iter()
                            .filter(|(t, _)| t == token)
                            .map(|(_, pttl)| *pttl)
                            .min()
                            .unwrap_or(-1);
                        (token.clone(), pttl)
                    })
            }
            Store::Memory(backend) => backend.peek(name).map(|(token, left)| {
                (
                    token,
                    i64::try_from(left.as_millis()).expect("lease fits in i64"),
                )
            }),
        }
    }

    /// The holder's token only.
    pub async fn holder_token(&self, name: &str) -> Option<String> {
        self.holder(name).await.map(|(token, _)| token)
    }

    /// How many lock records the store has (Redis: keys under the prefix
    /// except `:fence` counters, i.e. lock and meta keys; memory: held locks;
    /// Redlock: the most any node has).
    pub async fn lock_key_count(&self) -> usize {
        match &self.store {
            Store::Redis(server) => server
                .keys()
                .await
                .iter()
                .filter(|k| k.starts_with(PREFIX) && !k.ends_with(":fence"))
                .count(),
            // The most any node has: each node keeps its own copy.
            Store::Redlock(nodes) => {
                let mut most = 0;
                for node in nodes {
                    let count = node
                        .keys()
                        .await
                        .iter()
                        .filter(|k| k.starts_with(PREFIX) && !k.ends_with(":fence"))
                        .count();
                    most = most.max(count);
                }
                most
            }
            Store::Memory(backend) => backend.held_count(),
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Generates one `#[tokio::test]` per backend for each listed
/// `async fn name(app: &TestApp)` of the calling file: `redis::name` over a
/// fresh redis-server, `memory::name` over the in-memory backend and
/// `redlock::name` over Redlock on 3 fresh redis-servers.
///
/// `backend_tests!(mod m = |s: &mut Settings| ...; name, ...)` does the same
/// with settings changed by the closure, as `m::redis::name`,
/// `m::memory::name` and `m::redlock::name`. In both forms a name may carry attributes, such as
/// `#[ignore = "bug: ..."]`, given to both of its tests.
#[allow(unused_macros)]
macro_rules! backend_tests {
    (mod $module:ident = $tweak:expr; $($(#[$attr:meta])* $name:ident),* $(,)?) => {
        mod $module {
            mod redis {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    $(#[$attr])*
                    async fn $name() {
                        let app = crate::support::TestApp::redis_with($tweak).await;
                        super::super::$name(&app).await;
                    }
                )*
            }
            mod memory {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    $(#[$attr])*
                    async fn $name() {
                        let app = crate::support::TestApp::memory_with($tweak).await;
                        super::super::$name(&app).await;
                    }
                )*
            }
            mod redlock {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    $(#[$attr])*
                    async fn $name() {
                        let app = crate::support::TestApp::redlock_conformance($tweak).await;
                        super::super::$name(&app).await;
                    }
                )*
            }
        }
    };
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                $(#[$attr])*
                async fn $name() {
                    let app = crate::support::TestApp::redis().await;
                    super::$name(&app).await;
                }
            )*
        }
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                $(#[$attr])*
                async fn $name() {
                    let app = crate::support::TestApp::memory().await;
                    super::$name(&app).await;
                }
            )*
        }
        mod redlock {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                $(#[$attr])*
                async fn $name() {
                    let app = crate::support::TestApp::redlock_conformance(|_| {}).await;
                    super::$name(&app).await;
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use backend_tests;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// The sum of the samples `name{labels, ...}` in Prometheus text: every
/// sample that has at least `labels` (for example all nodes of
/// `lockd_backend_duration_seconds_count{op="acquire"}`); `None` when there
/// is none.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let wanted: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let matching: Vec<f64> = samples(text)
        .into_iter()
        .filter(|s| s.name == name && wanted.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| s.value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

/// One sample of Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the samples of Prometheus text format (comments skipped).
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(parse_sample)
        .collect()
}

fn bad_line<T>(line: &str) -> T {
    panic!("malformed metrics line {line:?}")
}

fn parse_sample(line: &str) -> Sample {
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| bad_line(line));
    let name = line[..name_end].to_owned();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices();
        let mut key = String::new();
        let end;
        loop {
            let (i, c) = chars.next().unwrap_or_else(|| bad_line(line));
            match c {
                '}' => {
                    end = i + 1;
                    break;
                }
                ',' => {}
                '=' => {
                    assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "{line}");
                    let mut value = String::new();
                    loop {
                        let (_, c) = chars.next().unwrap_or_else(|| bad_line(line));
                        match c {
                            '"' => break,
                            '\\' => value.push(chars.next().unwrap_or_else(|| bad_line(line)).1),
                            c => value.push(c),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                c => key.push(c),
            }
        }
        rest = &after[end..];
    }
    let value = rest
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| bad_line(line));
    Sample {
        name,
        labels,
        value,
    }
}

/// A valid client token that nobody uses (32 characters, like lockd's).
pub fn random_token() -> String {
    use base64::Engine as _;
    let bytes: [u8; 24] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
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
