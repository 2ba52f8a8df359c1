//! A Redis Cluster of real `redis-server` processes on loopback: 3 masters
//! with 2 replicas each ([`Cluster`]), made with `redis-cli --cluster
//! create`. [`shared_cluster`] starts one the first time a test asks and
//! shares it with every later test of the binary: tests that use it must
//! not change its topology (no failover, no reshard), and use lock names of
//! their own.
//!
//! The processes are started from a thread that lives as long as the test
//! binary, with a parent-death signal (`setpriv --pdeathsig KILL`), so they
//! die with the binary however it ends (a static is never dropped).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How many masters, and replicas of each.
pub const MASTERS: usize = 3;
const REPLICAS_PER_MASTER: usize = 2;

/// How long the cluster may take to form.
const FORM_TIMEOUT: Duration = Duration::from_secs(60);

/// A running Redis Cluster.
pub struct Cluster {
    ports: Vec<u16>,
    /// The processes by port, killed on drop, or with the thread that
    /// started them (parent-death signal).
    children: std::sync::Mutex<Vec<(u16, Child)>>,
    _dir: tempfile::TempDir,
}

/// The cluster shared by the tests of this binary, started on first use.
pub fn shared_cluster() -> Arc<Cluster> {
    static CLUSTER: OnceLock<Arc<Cluster>> = OnceLock::new();
    let cluster = CLUSTER.get_or_init(|| {
        // The thread that spawns a child with a parent-death signal must
        // outlive it: a test's thread ends with the test.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(Arc::new(Cluster::start()));
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("the cluster thread answers")
    });
    cluster.clone()
}

impl Cluster {
    /// Starts `MASTERS * (1 + REPLICAS_PER_MASTER)` servers with cluster
    /// mode on, joins them, and waits until every node reports
    /// `cluster_state:ok` and every master has its replicas in sync. A
    /// test that changes the topology (reshard, failover) starts its own,
    /// from its own thread (not `spawn_blocking`, whose threads end and
    /// take the nodes with them), and it stops on drop.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir for the cluster");
        let count = MASTERS * (1 + REPLICAS_PER_MASTER);
        let ports = free_port_pairs(count);
        let children = ports
            .iter()
            .map(|&port| {
                let node_dir = dir.path().join(port.to_string());
                std::fs::create_dir(&node_dir).expect("node dir");
                // setpriv (util-linux) sets the parent-death signal, then
                // runs redis-server.
                let mut cmd = Command::new("setpriv");
                cmd.args(["--pdeathsig", "KILL", "redis-server"])
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--cluster-enabled", "yes"])
                    .args(["--cluster-config-file", "nodes.conf"])
                    .args(["--cluster-node-timeout", "2000"])
                    .args(["--save", "", "--appendonly", "no"])
                    .arg("--dir")
                    .arg(&node_dir)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                (
                    port,
                    cmd.spawn().expect("spawn redis-server (cluster node)"),
                )
            })
            .collect();
        let cluster = Self {
            ports,
            children: std::sync::Mutex::new(children),
            _dir: dir,
        };
        for (port, child) in cluster
            .children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            wait_for_ping(*port);
            // Ours, not another test's server that took the port first.
            let info = cli(*port, &["INFO", "server"]);
            assert!(
                info.contains(&format!("process_id:{}", child.id())),
                "the server on {port} is not the one started here"
            );
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", &REPLICAS_PER_MASTER.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        cluster.wait_until_formed();
        cluster
    }

    fn wait_until_formed(&self) {
        let deadline = Instant::now() + FORM_TIMEOUT;
        loop {
            let ok = self
                .ports
                .iter()
                .all(|&p| cli(p, &["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            let masters = self.masters();
            let replicas_up = masters.len() == MASTERS
                && masters.iter().all(|&m| {
                    // In sync: a replica still loading the master's data
                    // acknowledges nothing (WAIT counts 0).
                    cli(m, &["INFO", "replication"])
                        .lines()
                        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                        .count()
                        == REPLICAS_PER_MASTER
                });
            if ok && replicas_up {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not form within {FORM_TIMEOUT:?}:\n{}",
                cli(self.live_port(), &["CLUSTER", "NODES"])
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A node that answers (the first one may have been killed).
    fn live_port(&self) -> u16 {
        self.ports
            .iter()
            .copied()
            .find(|p| cli(*p, &["PING"]).trim() == "PONG")
            .unwrap_or(self.ports[0])
    }

    /// The ports of the masters now, in the order of their first slot.
    pub fn masters(&self) -> Vec<u16> {
        let mut masters: Vec<(u32, u16)> = cli(self.live_port(), &["CLUSTER", "NODES"])
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let flags = *fields.get(2)?;
                if !flags.contains("master") || flags.contains("fail") {
                    return None;
                }
                let port = fields.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
                let first_slot = fields.get(8)?.split('-').next()?.parse().ok()?;
                Some((first_slot, port))
            })
            .collect();
        masters.sort_unstable();
        masters.into_iter().map(|(_, port)| port).collect()
    }

    /// `redis://127.0.0.1:<port>` of every node, masters and replicas.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// `redis://127.0.0.1:<port>` of the masters.
    pub fn master_urls(&self) -> Vec<String> {
        self.masters()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The port of the master that serves `key` now.
    pub fn master_of(&self, key: &str) -> u16 {
        let slot: u16 = cli(self.live_port(), &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("CLUSTER KEYSLOT answers a number");
        cli(self.live_port(), &["CLUSTER", "NODES"])
            .lines()
            .find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if !fields.get(2)?.contains("master") {
                    return None;
                }
                let serves = fields[8..].iter().any(|range| {
                    let mut ends = range.split('-').map(|n| n.parse::<u16>());
                    match (ends.next(), ends.next()) {
                        (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&slot),
                        (Some(Ok(a)), None) => a == slot,
                        _ => false,
                    }
                });
                serves.then(|| fields[1].split(['@', ':']).nth(1)?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// `GET` and `PTTL` of `key` on the master that serves it.
    pub fn get_with_pttl(&self, key: &str) -> Option<(String, i64)> {
        let port = self.master_of(key);
        let value = cli(port, &["GET", key]);
        let value = value.trim_end_matches('\n');
        if value.is_empty() {
            return None;
        }
        let pttl = cli(port, &["PTTL", key]).trim().parse().unwrap_or(-2);
        Some((value.to_owned(), pttl))
    }

    /// How many clients of the node on `port` are subscribed to the sharded
    /// channel `channel` (`PUBSUB SHARDNUMSUB`).
    pub fn shard_subscribers(&self, port: u16, channel: &str) -> u64 {
        cli(port, &["PUBSUB", "SHARDNUMSUB", channel])
            .lines()
            .nth(1)
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// How many pattern subscriptions the node on `port` has
    /// (`PUBSUB NUMPAT`).
    pub fn pattern_subscriptions(&self, port: u16) -> u64 {
        cli(port, &["PUBSUB", "NUMPAT"]).trim().parse().unwrap_or(0)
    }

    /// Runs `redis-cli -p <port> <args>` on one node and returns its output.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        cli(port, args)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let children = self.children.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, child) in children.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Cluster {
    /// Kills the node on `port` (SIGKILL), as a crash.
    pub fn kill(&self, port: u16) {
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, child)) = children.iter_mut().find(|(p, _)| *p == port) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the node on `port`: a frozen
    /// node keeps its connections open and answers nothing.
    pub fn signal(&self, port: u16, signal: &str) {
        let children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, child)) = children.iter().find(|(p, _)| *p == port) {
            let status = Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status()
                .expect("run kill");
            assert!(status.success(), "kill -{signal} {port}");
        }
    }

    /// Waits, up to `within`, until every replica of the master on `port`
    /// has acknowledged every write the master had when called (the
    /// `offset=` of each `slaveN:` line of its `INFO replication`, against
    /// its `master_repl_offset`), so that killing the master then loses
    /// nothing written before, whichever replica the cluster promotes (with
    /// one lagging behind, a busy machine can promote that one). Returns
    /// whether they did.
    pub async fn replicated_within(&self, port: u16, within: Duration) -> bool {
        let field = |info: &str, name: &str| -> Option<u64> {
            info.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.parse().ok())
        };
        let info = cli(port, &["INFO", "replication"]);
        let Some(written) = field(&info, "master_repl_offset:") else {
            return false;
        };
        crate::support::eventually(within, || async {
            let info = cli(port, &["INFO", "replication"]);
            let replicas: Vec<&str> = info
                .lines()
                .filter(|line| line.starts_with("slave") && line.contains(":ip="))
                .collect();
            replicas.len() == REPLICAS_PER_MASTER
                && replicas.iter().all(|line| {
                    line.contains("state=online")
                        && line
                            .split(',')
                            .find_map(|kv| kv.strip_prefix("offset="))
                            .and_then(|o| o.parse::<u64>().ok())
                            .is_some_and(|o| o >= written)
                })
        })
        .await
    }

    /// The node id of the node on `port`.
    pub fn node_id(&self, port: u16) -> String {
        cli(port, &["CLUSTER", "MYID"]).trim().to_owned()
    }

    /// The first slot of the master on `port` (its lowest range's start).
    pub fn first_slot_of(&self, port: u16) -> u16 {
        cli(self.live_port(), &["CLUSTER", "NODES"])
            .lines()
            .find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let at: u16 = fields.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
                (at == port).then(|| fields.get(8)?.split('-').next()?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("{port} serves no slot"))
    }

    /// The slot of `key`.
    pub fn slot(&self, key: &str) -> u16 {
        cli(self.live_port(), &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("CLUSTER KEYSLOT answers a number")
    }

    /// Moves `slots` slots from the master on `from` to the master on `to`
    /// with `redis-cli --cluster reshard` (the keys move with them), and
    /// waits for it to finish.
    pub fn reshard(&self, from: u16, to: u16, slots: u16) -> String {
        let out = Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{from}")])
            .args(["--cluster-from", &self.node_id(from)])
            .args(["--cluster-to", &self.node_id(to)])
            .args(["--cluster-slots", &slots.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster reshard");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "reshard failed:\n{text}");
        text
    }

    /// [`Self::wait_until_healthy`] on a blocking thread (it runs
    /// `redis-cli`), for async tests.
    pub async fn healed_within(self: &Arc<Self>, within: Duration) -> bool {
        let cluster = self.clone();
        tokio::task::spawn_blocking(move || cluster.wait_until_healthy(within))
            .await
            .expect("wait for the failover")
    }

    /// Waits until every live node says `cluster_state:ok` and `MASTERS`
    /// live masters serve the slots (after a failover: right after a kill
    /// the dead master is still listed, unflagged, for a moment).
    pub fn wait_until_healthy(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let live: Vec<u16> = self
                .ports
                .iter()
                .copied()
                .filter(|p| cli(*p, &["PING"]).trim() == "PONG")
                .collect();
            let ok = live
                .iter()
                .all(|&p| cli(p, &["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            let masters = self.masters();
            if ok && masters.len() == MASTERS && masters.iter().all(|m| live.contains(m)) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `redis-cli -p <port> <args>`'s stdout (empty when it fails).
/// Gives up after 2 s (coreutils `timeout`): a frozen node (SIGSTOP)
/// accepts the connection and never answers.
fn cli(port: u16, args: &[&str]) -> String {
    Command::new("timeout")
        .args(["2", "redis-cli", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default()
}

/// Waits until the server on `port` answers `PING`.
fn wait_for_ping(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while cli(port, &["PING"]).trim() != "PONG" {
        assert!(
            Instant::now() < deadline,
            "redis-server on {port} did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `count` ports that are free, each with its cluster bus port (+10000)
/// free too.
fn free_port_pairs(count: usize) -> Vec<u16> {
    // One cursor for the whole binary, so that two clusters started at once
    // never try the same ports.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let start = std::process::id() % 5_000;
    let mut ports = Vec::with_capacity(count);
    while ports.len() < count {
        let offset = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let candidate = u16::try_from(20_000 + (start + offset) % 10_000).expect("fits");
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(candidate) && free(candidate + 10_000) {
            ports.push(candidate);
        }
    }
    ports
}
