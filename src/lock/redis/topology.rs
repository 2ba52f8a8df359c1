//! The start-up check of what each Redis URL is: that the servers are what
//! `--redis-mode` says (a cluster node only in cluster mode, Sentinels only
//! in Sentinel mode, never a replica), and, with `--min-replicas-acked`, how
//! many replicas each master has in sync. Redlock over the masters of one
//! cluster would fail request after request with `MOVED` and a quorum it
//! never reaches (field case C14).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::connect::{self, ConnectReport, RedisTls};

/// How the Redis URLs are used, as `--redis-mode` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One standalone server.
    Single,
    /// Independent standalone masters.
    Redlock,
    /// The seeds of a Redis Cluster.
    Cluster,
    /// Redis Sentinels that name the master.
    Sentinel,
}

impl Mode {
    /// The mode's `--redis-mode` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Redlock => "redlock",
            Self::Cluster => "cluster",
            Self::Sentinel => "sentinel",
        }
    }
}

/// What the URLs should be.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// How they are used.
    pub mode: Mode,
    /// The master name Sentinels should know (`--sentinel-master`).
    pub sentinel_master: Option<&'a str>,
    /// `--min-replicas-acked`: when above 0, masters short of that many
    /// replicas in sync are warned of.
    pub min_replicas_acked: usize,
}

/// One Redis URL to check.
pub struct Target<'a> {
    /// The URL as the backend connects to it (password included).
    pub url: &'a str,
    /// The URL as shown in errors: without its password.
    pub shown: String,
    /// The node's `host:port`, for logs.
    pub node: String,
    /// Where a TLS failure is reported: the report the backend then
    /// shares, so that it is logged once.
    pub report: std::sync::Arc<ConnectReport>,
}

/// A URL is not what the mode needs; the message names the URL (without
/// its password) and the mode to use.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct WrongTopology(pub String);

/// How long the start-up check waits for each Redis URL.
const TOPOLOGY_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Checks, on every Redis URL that answers within
/// two seconds, that the server is what `--redis-mode` says
/// (`redis_mode` in `INFO server`): a cluster node only in cluster mode,
/// and only cluster nodes there; Sentinels in Sentinel mode (and one of them
/// knows the master by its name), and no Sentinel elsewhere. Redlock over
/// the masters of one cluster would fail request after request with `MOVED`
/// and a quorum it never reaches (field case C14). In Redlock mode, no two
/// URLs may reach one server (the same `run_id`: `127.0.0.1:6379` and
/// `localhost:6379`), which would count twice towards the quorum. A URL
/// that does not answer is not checked: lockd starts while Redis is down,
/// and logs one warning naming the node (never the password).
///
/// The probe connects as the backend will (`tls` for `rediss://` URLs); a
/// TLS failure is reported to the target's `report`, which the
/// backend then shares, so that it is logged once.
///
/// # Errors
/// [`WrongTopology`], naming the URL (without its password) and
/// the mode to use.
pub async fn check(
    expected: &Expected<'_>,
    targets: &[Target<'_>],
    tls: &RedisTls,
) -> Result<(), WrongTopology> {
    let mode = expected.mode;
    let mut masters_known = None;
    // Each master once, as the first URL that told of it said.
    let mut short_of_replicas = BTreeMap::new();
    // Each Redlock node's server, by its run_id: two URLs of one server
    // are one node, and Redlock's quorum would count it twice.
    let mut servers: BTreeMap<String, &str> = BTreeMap::new();
    for target in targets {
        let url = &target.shown;
        let acks_wanted = expected.min_replicas_acked > 0;
        let Some(probe) = probe(
            target.url,
            expected.sentinel_master,
            acks_wanted,
            tls,
            &target.report,
        )
        .await
        else {
            tracing::warn!(
                node = %target.node,
                "Redis did not answer at start-up; lockd starts all the same, answers 503 \
                 for what needs it, and keeps trying"
            );
            continue;
        };
        let wrong = |what: &str, use_instead: &str| {
            Err(WrongTopology(format!(
                "{url} is {what}, which --redis-mode {} cannot use; {use_instead}",
                mode.as_str()
            )))
        };
        match (mode, probe.server_mode.as_str()) {
            (Mode::Cluster, "cluster") | (Mode::Sentinel, "sentinel") => {}
            (Mode::Single | Mode::Redlock, "standalone") => {}
            (_, "cluster") => {
                return wrong(
                    "a node of a Redis Cluster (redis_mode:cluster): keys live on the master \
                     of their slot",
                    "use --redis-mode cluster, with these URLs as seeds",
                );
            }
            (_, "sentinel") => {
                return wrong(
                    "a Redis Sentinel (redis_mode:sentinel)",
                    "use --redis-mode sentinel --sentinel-master NAME, with the Sentinels' URLs",
                );
            }
            (Mode::Cluster, _) => {
                return wrong(
                    "not a Redis Cluster node (cluster_enabled:0)",
                    "use --redis-mode single for one server, or redlock for independent masters",
                );
            }
            (_, other) => {
                return wrong(
                    &format!("not a Sentinel (redis_mode:{other})"),
                    "give the Sentinels' URLs (port 26379 by default)",
                );
            }
        }
        if let Some(master) = &probe.replica_of {
            let instead = if mode == Mode::Redlock {
                "Redlock nodes must be independent masters, not a master and its replicas; \
                 give independent masters, or, when Redis Sentinel watches these, use \
                 --redis-mode sentinel --sentinel-master NAME with the Sentinels' URLs"
            } else {
                "give the master's URL, or, when Redis Sentinel watches it, use --redis-mode \
                 sentinel --sentinel-master NAME with the Sentinels' URLs"
            };
            return wrong(
                &format!(
                    "a replica of {master} (role:slave in INFO replication): every write there \
                     fails with READONLY"
                ),
                instead,
            );
        }
        if mode == Mode::Redlock
            && !probe.run_id.is_empty()
            && let Some(first) = servers.insert(probe.run_id.clone(), url)
        {
            return Err(WrongTopology(format!(
                "{first} and {url} are the same Redis server (run_id {}): Redlock's nodes \
                 must be independent masters, and one server given twice would count twice \
                 towards the quorum; give each server once",
                probe.run_id
            )));
        }
        if let Some(known) = probe.knows_master {
            *masters_known.get_or_insert(false) |= known;
        }
        if mode == Mode::Cluster && probe.version_major.is_some_and(|v| v < 7) {
            tracing::warn!(
                node = %target.node,
                "this Redis Cluster node runs Redis {}: release events need sharded pub/sub \
                 (SPUBLISH, Redis 7), so waiters wake only when the holder's lease ends",
                probe.version
            );
        }
        for (master, up) in probe.replicas {
            short_of_replicas.entry(master).or_insert(up);
        }
    }
    let wanted = expected.min_replicas_acked;
    for (master, up) in short_of_replicas.iter().filter(|(_, up)| **up < wanted) {
        tracing::warn!(
            "--min-replicas-acked is {wanted}, but {master} has {up} replica(s) in sync: every \
             grant there is answered 503 replication-lagging until enough replicas are back"
        );
    }
    if let (Some(false), Some(name)) = (masters_known, expected.sentinel_master) {
        return Err(WrongTopology(format!(
            "no Sentinel monitors a master named {name:?} (--sentinel-master); \
             SENTINEL masters lists the names"
        )));
    }
    Ok(())
}

/// What one Redis URL answered at start-up.
struct Probe {
    /// `redis_mode` of `INFO server`: `standalone`, `cluster` or
    /// `sentinel`.
    server_mode: String,
    /// For a Sentinel, with a master name: whether it knows that master.
    knows_master: Option<bool>,
    /// `redis_version` of `INFO server`.
    version: String,
    /// `run_id` of `INFO server`: the server process, whatever the
    /// address it was reached by (empty when not told).
    run_id: String,
    /// For a standalone server that is a replica (`role:slave` in `INFO
    /// replication`): its master's `host:port`.
    replica_of: Option<String>,
    /// Its major version, when it parses.
    version_major: Option<u32>,
    /// When replica acknowledgements are asked for: each master this URL
    /// tells of (the server itself, a Sentinel's master, or every master
    /// of a cluster), with its replicas that are up.
    replicas: Vec<(String, usize)>,
}

/// The masters the server behind `conn` tells of, each with how many of
/// its replicas are up: a standalone master's connected replicas (`INFO
/// replication`), the replicas a Sentinel sees of `sentinel_master` that
/// are not down, or, on a cluster node, every master's replicas that are
/// not failing (`CLUSTER NODES`). Empty when it cannot tell.
async fn replicas_up(
    conn: &mut redis::aio::MultiplexedConnection,
    server_mode: &str,
    sentinel_master: Option<&str>,
) -> Vec<(String, usize)> {
    match (server_mode, sentinel_master) {
        ("sentinel", Some(name)) => {
            let replicas: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
                .arg("replicas")
                .arg(name)
                .query_async(conn)
                .await
                .unwrap_or_default();
            let up = replicas
                .iter()
                .filter(|r| {
                    r.get("flags")
                        .is_some_and(|f| !f.contains("down") && !f.contains("disconnected"))
                })
                .count();
            vec![(format!("the master {name:?}"), up)]
        }
        ("cluster", _) => {
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(conn)
                .await
                .unwrap_or_default();
            cluster_replicas_up(&nodes)
        }
        _ => {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(conn)
                .await
                .unwrap_or_default();
            if !info.lines().any(|l| l.trim() == "role:master") {
                return Vec::new();
            }
            let up = info
                .lines()
                .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            vec![("the server".to_owned(), up)]
        }
    }
}

/// The master (`host:port`) of a server whose `INFO replication` says
/// `role:slave`; `None` for a master, or when it does not say.
fn replica_of(replication: &str) -> Option<String> {
    let field = |name: &str| {
        replication
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .map(str::to_owned)
    };
    if field("role:")?.as_str() != "slave" {
        return None;
    }
    let host = field("master_host:").unwrap_or_else(|| "?".into());
    let port = field("master_port:").unwrap_or_else(|| "?".into());
    Some(format!("{host}:{port}"))
}

/// Every master of a `CLUSTER NODES` listing (`host:port`, `master` in its
/// flags, not failing), with its replicas that are not failing.
fn cluster_replicas_up(nodes: &str) -> Vec<(String, usize)> {
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| f.len() >= 8)
        .collect();
    let failing = |flags: &str| flags.contains("fail") || flags.contains("noaddr");
    lines
        .iter()
        .filter(|f| f[2].contains("master") && !failing(f[2]))
        .map(|master| {
            let up = lines
                .iter()
                .filter(|f| f[2].contains("slave") && f[3] == master[0] && !failing(f[2]))
                .count();
            let addr = master[1].split('@').next().unwrap_or(master[1]);
            (format!("the master {addr}"), up)
        })
        .collect()
}

/// Asks the server at `url` what it is (and, with `acks_wanted`, how many
/// replicas its masters have); `None` when it does not answer in time. A
/// TLS failure goes to `report`.
async fn probe(
    url: &str,
    sentinel_master: Option<&str>,
    acks_wanted: bool,
    tls: &RedisTls,
    report: &ConnectReport,
) -> Option<Probe> {
    let probe = async {
        let client = connect::client(url, tls).ok()?;
        let mut conn = match client.connect(TOPOLOGY_PROBE_TIMEOUT).await {
            Ok(conn) => conn,
            Err(e) => {
                report.failed(&e);
                return None;
            }
        };
        let info: String = match redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
        {
            Ok(info) => info,
            Err(e) => {
                report.failed(&e);
                return None;
            }
        };
        let server_mode = info
            .lines()
            .find_map(|l| l.trim().strip_prefix("redis_mode:"))
            .unwrap_or("standalone")
            .to_owned();
        let knows_master = match (server_mode.as_str(), sentinel_master) {
            ("sentinel", Some(name)) => Some(
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(name)
                    .query_async::<Option<Vec<String>>>(&mut conn)
                    .await
                    .ok()
                    .flatten()
                    .is_some(),
            ),
            _ => None,
        };
        let version = info
            .lines()
            .find_map(|l| l.trim().strip_prefix("redis_version:"))
            .unwrap_or_default()
            .to_owned();
        let version_major = version.split('.').next().and_then(|v| v.parse().ok());
        let run_id = info
            .lines()
            .find_map(|l| l.trim().strip_prefix("run_id:"))
            .unwrap_or_default()
            .to_owned();
        let replicas = if acks_wanted {
            replicas_up(&mut conn, &server_mode, sentinel_master).await
        } else {
            Vec::new()
        };
        let replica_of = if server_mode == "standalone" {
            let replication: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            replica_of(&replication)
        } else {
            None
        };
        Some(Probe {
            server_mode,
            knows_master,
            version,
            run_id,
            replica_of,
            version_major,
            replicas,
        })
    };
    tokio::time::timeout(TOPOLOGY_PROBE_TIMEOUT, probe)
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_names_its_master_and_a_master_names_none() {
        let replica =
            "# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:6380\r\n";
        assert_eq!(replica_of(replica).as_deref(), Some("127.0.0.1:6380"));
        assert_eq!(replica_of("role:master\r\nconnected_slaves:2\r\n"), None);
        assert_eq!(replica_of(""), None);
    }

    #[test]
    fn a_cluster_listing_gives_each_live_master_its_live_replicas() {
        let nodes = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
a2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922
a3 127.0.0.1:7002@17002 master,fail - 0 0 3 disconnected
b1 127.0.0.1:7003@17003 slave a1 0 0 1 connected
b2 127.0.0.1:7004@17004 slave a1 0 0 1 connected
b3 127.0.0.1:7005@17005 slave,fail a2 0 0 2 disconnected
b4 127.0.0.1:7006@17006 master - 0 0 4 connected 10923-16383
";
        assert_eq!(
            cluster_replicas_up(nodes),
            [
                ("the master 127.0.0.1:7000".to_owned(), 2),
                ("the master 127.0.0.1:7001".to_owned(), 0),
                ("the master 127.0.0.1:7006".to_owned(), 0),
            ]
        );
    }
}
