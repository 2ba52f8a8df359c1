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
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How many masters, and replicas of each.
pub const MASTERS: usize = 3;
const REPLICAS_PER_MASTER: usize = 2;

/// How long the cluster may take to form.
const FORM_TIMEOUT: Duration = Duration::from_secs(60);

/// A running Redis Cluster.
pub struct Cluster {
    ports: Vec<u16>,
    /// The processes, killed with the binary (parent-death signal).
    _children: Vec<Child>,
    _dir: tempfile::TempDir,
}

/// The cluster shared by the tests of this binary, started on first use.
pub fn shared_cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        // The thread that spawns a child with a parent-death signal must
        // outlive it: a test's thread ends with the test.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(Cluster::start());
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("the cluster thread answers")
    })
}

impl Cluster {
    /// Starts `MASTERS * (1 + REPLICAS_PER_MASTER)` servers with cluster
    /// mode on, joins them, and waits until every node reports
    /// `cluster_state:ok` and every master has its replicas.
    fn start() -> Self {
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
                cmd.spawn().expect("spawn redis-server (cluster node)")
            })
            .collect();
        let cluster = Self {
            ports,
            _children: children,
            _dir: dir,
        };
        for &port in &cluster.ports {
            wait_for_ping(port);
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
                cli(self.ports[0], &["CLUSTER", "NODES"])
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The ports of the masters now, in the order of their first slot.
    pub fn masters(&self) -> Vec<u16> {
        let mut masters: Vec<(u32, u16)> = cli(self.ports[0], &["CLUSTER", "NODES"])
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
        let slot: u16 = cli(self.ports[0], &["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("CLUSTER KEYSLOT answers a number");
        cli(self.ports[0], &["CLUSTER", "NODES"])
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

    /// Runs `redis-cli -p <port> <args>` on one node and returns its output.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        cli(port, args)
    }
}

/// `redis-cli -p <port> <args>`'s stdout (empty when it fails).
fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-p", &port.to_string()])
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
    let mut ports = Vec::with_capacity(count);
    let mut candidate = 20_000 + u16::try_from(std::process::id() % 5_000).expect("fits");
    while ports.len() < count {
        candidate = if candidate >= 29_999 {
            20_000
        } else {
            candidate + 1
        };
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(candidate) && free(candidate + 10_000) {
            ports.push(candidate);
        }
    }
    ports
}
