//! A Redis Sentinel set on loopback ([`SentinelSet`]): a master, two
//! replicas and three `redis-sentinel` processes monitoring it as
//! [`MASTER_NAME`]. Each test that fails it over starts its own; every
//! process is killed on drop.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{RedisServer, eventually, free_port};

/// The name the Sentinels monitor the master by.
pub const MASTER_NAME: &str = "lockd-test";

/// How long the set may take to come up, or to fail over.
const SETTLE: Duration = Duration::from_secs(30);

/// A master, two replicas and three Sentinels.
pub struct SentinelSet {
    /// The master first, then the replicas (the roles change on failover;
    /// see [`Self::master_port`]).
    pub servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
}

pub(super) struct SentinelProcess {
    port: u16,
    /// `redis-cli`'s options to reach it.
    cli: Vec<String>,
    child: Mutex<Child>,
    _dir: tempfile::TempDir,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl SentinelSet {
    /// Starts the servers, makes two of them replicas of the first, waits
    /// until both are in sync, then starts the Sentinels and waits until
    /// each knows the master, both replicas and the two other Sentinels.
    pub async fn start() -> Self {
        let mut servers = Vec::new();
        for _ in 0..3 {
            servers.push(RedisServer::spawn().await);
        }
        let master = servers[0].port();
        for replica in &servers[1..] {
            let _: () = replica
                .cmd(redis::cmd("REPLICAOF").arg("127.0.0.1").arg(master))
                .await;
        }
        let synced = eventually(SETTLE, || async {
            let info: String = servers[0].cmd(redis::cmd("INFO").arg("replication")).await;
            info.lines()
                .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                .count()
                == 2
        })
        .await;
        assert!(synced, "the replicas did not sync within {SETTLE:?}");
        let sentinels = (0..3).map(|_| SentinelProcess::start(master)).collect();
        let set = Self { servers, sentinels };
        let ready = eventually(SETTLE, || async {
            set.sentinels.iter().all(|s| {
                let info = s.cli(&["SENTINEL", "master", MASTER_NAME]);
                field(&info, "num-slaves") == Some("2")
                    && field(&info, "num-other-sentinels") == Some("2")
            })
        })
        .await;
        assert!(ready, "the Sentinels did not settle within {SETTLE:?}");
        set
    }

    /// `redis://127.0.0.1:<port>` of each Sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }

    /// The port of the master, as the first Sentinel names it now.
    pub fn master_port(&self) -> u16 {
        let answer = self.sentinels[0].cli(&["SENTINEL", "get-master-addr-by-name", MASTER_NAME]);
        answer
            .lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no master named: {answer:?}"))
    }

    /// The ports of the servers other than the master of the moment.
    pub fn replica_ports(&self) -> Vec<u16> {
        let master = self.master_port();
        self.servers
            .iter()
            .map(RedisServer::port)
            .filter(|&p| p != master)
            .collect()
    }

    /// The server whose port is `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no server on {port}"))
    }

    /// Asks the first Sentinel to fail over (`SENTINEL FAILOVER`), and
    /// waits until every Sentinel names a new master that calls itself
    /// master. Returns the new master's port.
    pub async fn fail_over(&self) -> u16 {
        self.fail_over_via(0).await
    }

    /// [`Self::fail_over`], asked of Sentinel `i` (the others hear of it
    /// a moment later).
    pub async fn fail_over_via(&self, i: usize) -> u16 {
        let old = self.master_port();
        let said = self.sentinels[i].cli(&["SENTINEL", "FAILOVER", MASTER_NAME]);
        assert!(said.trim() == "OK", "SENTINEL FAILOVER: {said:?}");
        self.wait_for_new_master(old).await
    }

    /// Waits until every Sentinel names a master other than `old`, and
    /// that server calls itself master; returns its port.
    pub async fn wait_for_new_master(&self, old: u16) -> u16 {
        let deadline = Instant::now() + SETTLE;
        loop {
            let named: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|s| {
                    s.cli(&["SENTINEL", "get-master-addr-by-name", MASTER_NAME])
                        .lines()
                        .nth(1)
                        .and_then(|p| p.trim().parse().ok())
                })
                .collect();
            if let Some(Some(new)) = named.first()
                && *new != old
                && named.iter().all(|n| *n == Some(*new))
            {
                let role: String = self
                    .server(*new)
                    .cmd(redis::cmd("INFO").arg("replication"))
                    .await;
                if role.contains("role:master") {
                    return *new;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no new master within {SETTLE:?}: {named:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl SentinelProcess {
    /// A plain-TCP Sentinel of a [`SentinelSet`] (quorum 2, down after
    /// 1 s), watching `master`; waits until it answers `PING`.
    fn start(master: u16) -> Self {
        let sentinel = Self::spawn(
            |port, dir| {
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 4000\n\
                     sentinel parallel-syncs {MASTER_NAME} 2\n",
                    dir.display()
                )
            },
            Vec::new(),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while sentinel.cli(&["PING"]).trim() != "PONG" {
            assert!(
                Instant::now() < deadline,
                "redis-sentinel on {} did not start",
                sentinel.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        sentinel
    }

    /// Starts `redis-sentinel` on a free port with the configuration
    /// `conf(port, dir)` returns (`dir` is the Sentinel's own temporary
    /// directory). `cli` are the `redis-cli` options that reach it (such
    /// as TLS), used by [`Self::cli`]. Does not wait for it to answer.
    pub(super) fn spawn(conf: impl FnOnce(u16, &Path) -> String, cli: Vec<String>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for a Sentinel");
        let port = free_port();
        let path = dir.path().join("sentinel.conf");
        std::fs::write(&path, conf(port, dir.path())).expect("write sentinel.conf");
        let child = Command::new("redis-sentinel")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-sentinel");
        Self {
            port,
            cli,
            child: Mutex::new(child),
            _dir: dir,
        }
    }

    /// The Sentinel's port.
    pub(super) fn port(&self) -> u16 {
        self.port
    }

    /// `redis-cli` against this Sentinel: its standard output, empty
    /// when it could not run.
    pub(super) fn cli(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.cli)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default()
    }
}

/// The value after `name` in the flat field list `SENTINEL master` prints
/// (one item per line).
fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    let mut lines = info.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if line == name {
            return lines.next();
        }
    }
    None
}
