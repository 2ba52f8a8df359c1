//! A real `redis-server` on a loopback port: [`RedisServer`].

use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::free_port;

/// The key prefix lockd uses by default.
pub const PREFIX: &str = "lockd:";

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
            // The guard must be gone before the block locks again (an
            // `if let` keeps its scrutinee's temporaries for the whole
            // block: a server that exited at start deadlocked here).
            let exited = self
                .child
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
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

    /// How many clients are subscribed to the change channel of lock
    /// `name` (`PUBSUB NUMSUB`): a lockd instance subscribes while one of
    /// its waiters or watches follows the lock.
    pub async fn lock_channel_subscribers(&self, name: &str) -> usize {
        let channel = format!("{}:released", lock_key(name));
        let (_, count): (String, usize) = self
            .cmd(redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel))
            .await;
        count
    }

    /// Waits, for at most 10 s, until `n` clients are subscribed to the
    /// change channel of lock `name` (see
    /// [`RedisServer::lock_channel_subscribers`]).
    pub async fn until_lock_channel_subscribers(&self, name: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.lock_channel_subscribers(name).await;
            if now == n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{now} subscribers to the changes of {name}, expected {n}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
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
    /// data model in `src/lock/redis/mod.rs`): the lock key under `token` and
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

/// The Redis key of lock `name`.
pub fn lock_key(name: &str) -> String {
    format!("{PREFIX}{{{name}}}")
}
