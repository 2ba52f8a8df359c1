//! The Redis connection pool: deadpool's managed pool over multiplexed
//! connections (to one server, to the master a Sentinel set names, or a
//! Redis Cluster connection that routes each command to the master of its
//! key's slot), with a manager that does not talk to Redis when it hands a
//! connection out. On a change of master ([`ClusterView`] for a cluster,
//! the Sentinels' generation otherwise), connections opened before it are
//! dropped rather than handed out.
//!
//! deadpool-redis's manager sends `UNWATCH` + `PING` each time the pool
//! hands out a connection: one more round trip for every lock operation,
//! measured at half of all commands lockd sent to Redis. Here a connection
//! is handed out as it is; one that broke (Redis restarted) is found by the
//! operation itself, which throws it away together with every idle
//! connection and tries once more on a fresh one (see
//! [`crate::lock::redis::RedisBackend`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use deadpool::managed::{self, Metrics, RecycleResult};
use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use super::connect::{self, PushHandler, RedisTls};
use super::restart::RestartWatch;
use super::sentinel::Sentinels;
use crate::lock::LockError;

/// What a [`Connector`] connects to.
pub enum Target {
    /// One Redis server (boxed: a client is large).
    Server(Box<connect::Client>),
    /// A Redis Cluster, found from its seed nodes. The connection follows
    /// `MOVED` and `ASK`, and refreshes its slot map when the cluster
    /// changes.
    Cluster(Box<ClusterTarget>),
    /// The master of a Sentinel set, as the Sentinels name it now.
    Sentinel(Arc<Sentinels>),
}

/// What lockd knows of a cluster's nodes, from the last `CLUSTER NODES` it
/// read: shared by every connection to one cluster (the pool's and the
/// release-event one's), and by the metrics.
pub struct ClusterView {
    /// Every node (`host:port`) not failing.
    nodes: Mutex<Vec<String>>,
    /// The nodes flagged failing (`fail` or `fail?`) at the last reading.
    failing: Mutex<Vec<String>>,
    /// The masters that serve slots, as [`Topology::serving`] finds them.
    masters: Mutex<Vec<String>>,
    /// Each node as the freshest listing told of it, so that a node that
    /// has not heard of a failover yet moves nothing back.
    topology: Mutex<Topology>,
    /// Masters that appeared after the first reading (a replica promoted,
    /// a master added): the failovers seen, mostly.
    new_masters: AtomicU64,
    /// Bumped whenever the set of masters changes: connections opened
    /// before hold a slot map that may send writes to a master that was
    /// replaced (one frozen, say, which answers again later), so the pool
    /// drops them and the release-event subscriber starts afresh.
    generation: watch::Sender<u64>,
}

impl Default for ClusterView {
    fn default() -> Self {
        Self {
            nodes: Mutex::default(),
            failing: Mutex::default(),
            masters: Mutex::default(),
            topology: Mutex::default(),
            new_masters: AtomicU64::new(0),
            generation: watch::channel(0).0,
        }
    }
}

/// The [`ClusterView`] of one cluster, shared.
pub type KnownNodes = Arc<ClusterView>;

impl ClusterView {
    /// Takes in a `CLUSTER NODES` listing.
    pub fn observe(&self, listing: &str) {
        let nodes = parse_cluster_nodes(listing);
        if nodes.is_empty() {
            return;
        }
        *lock(&self.nodes) = nodes;
        *lock(&self.failing) = failing_nodes(listing);
        let mut topology = lock(&self.topology);
        let appeared = topology.observe(listing);
        let masters = topology.serving();
        drop(topology);
        self.new_masters.fetch_add(appeared, Ordering::Relaxed);
        let mut known = lock(&self.masters);
        if !known.is_empty() && *known != masters {
            self.generation.send_modify(|g| *g += 1);
            tracing::debug!(?masters, "the cluster's masters changed");
        }
        *known = masters;
    }

    /// Every node not failing, as last seen.
    pub fn nodes(&self) -> Vec<String> {
        lock(&self.nodes).clone()
    }

    /// Whether `addr` was flagged failing at the last reading.
    pub fn is_failing(&self, addr: &str) -> bool {
        lock(&self.failing).iter().any(|a| a == addr)
    }

    /// The masters serving slots, as last seen.
    pub fn masters(&self) -> Vec<String> {
        lock(&self.masters).clone()
    }

    /// The masters serving slots, each with the first slot it serves, in
    /// the order of those slots, as last seen: the order in which a
    /// listing walks them (see [`crate::lock::listing`]).
    pub fn shards(&self) -> Vec<(u16, String)> {
        lock(&self.topology).shards()
    }

    /// The generation of the set of masters (see [`ClusterView`]).
    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Changes of the generation, to wait on.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// How many masters appeared since the first reading.
    pub fn new_masters(&self) -> u64 {
        self.new_masters.load(Ordering::Relaxed)
    }
}

/// What the `CLUSTER NODES` listings read so far say of each node (by
/// node ID). A listing comes from any node, and a node that has not heard
/// of the last failover yet still names the old master, with the older
/// config epoch: a line about a node is taken only when its config epoch
/// (the node's own, or its master's for a replica) is at least the one
/// held. Redis Cluster resolves slot ownership the same way: a slot
/// belongs to the master that claims it with the highest epoch.
#[derive(Debug, Default)]
struct Topology {
    nodes: std::collections::HashMap<String, NodeView>,
    /// Whether a listing was taken in yet: the first one counts no master
    /// as new.
    seen: bool,
}

/// One node, as the freshest listing told of it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeView {
    addr: String,
    master: bool,
    epoch: u64,
    /// The slot ranges it claims (inclusive).
    slots: Vec<(u16, u16)>,
}

impl Topology {
    /// Takes in one listing; returns how many masters appeared in it: a
    /// node not seen before that is a master, or a replica promoted (seen
    /// as a master at a higher epoch than as a replica). An old master
    /// promoted again after it came back as a replica counts again; one
    /// that a stale listing still calls master does not.
    fn observe(&mut self, listing: &str) -> u64 {
        let mut appeared = 0;
        for line in listing.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(id), Some(addr), Some(flags), Some(epoch)) =
                (f.first(), f.get(1), f.get(2), f.get(6))
            else {
                continue;
            };
            let (Some(addr), Ok(epoch)) = (
                addr.split('@').next().filter(|a| !a.is_empty()),
                epoch.parse::<u64>(),
            ) else {
                continue;
            };
            let view = NodeView {
                addr: addr.to_owned(),
                master: flags.split(',').any(|f| f == "master"),
                epoch,
                slots: f.iter().skip(8).filter_map(|r| slot_range(r)).collect(),
            };
            match self.nodes.get(*id) {
                Some(held) if held.epoch > view.epoch => continue,
                Some(held) if !held.master && view.master && view.epoch > held.epoch => {
                    appeared += 1;
                }
                None if view.master && self.seen => appeared += 1,
                _ => {}
            }
            self.nodes.insert((*id).to_owned(), view);
        }
        self.seen |= !self.nodes.is_empty();
        appeared
    }

    /// The masters that serve slots (`host:port`, sorted): each slot goes
    /// to the master that claims it with the highest epoch, and a master
    /// left with none (its slots were taken over) serves none.
    fn serving(&self) -> Vec<String> {
        let mut serving: Vec<String> = self.shards().into_iter().map(|(_, addr)| addr).collect();
        serving.sort();
        serving.dedup();
        serving
    }

    /// The masters that serve slots, as [`Self::serving`] finds them, each
    /// with the first slot it serves, ordered by that slot.
    fn shards(&self) -> Vec<(u16, String)> {
        let mut claimants: Vec<&NodeView> = self
            .nodes
            .values()
            .filter(|n| n.master && !n.slots.is_empty())
            .collect();
        claimants.sort_by(|a, b| b.epoch.cmp(&a.epoch).then_with(|| a.addr.cmp(&b.addr)));
        let mut taken = vec![false; 16_384];
        let mut shards: Vec<(u16, String)> = Vec::new();
        for node in claimants {
            let mut first: Option<u16> = None;
            for &(from, to) in &node.slots {
                for slot in from..=to.min(16_383) {
                    if let Some(t) = taken.get_mut(usize::from(slot))
                        && !*t
                    {
                        *t = true;
                        first = Some(first.map_or(slot, |f| f.min(slot)));
                    }
                }
            }
            if let Some(first) = first {
                shards.push((first, node.addr.clone()));
            }
        }
        shards.sort();
        shards
    }
}

/// A slot range of a `CLUSTER NODES` line (`0-5460` or `5461`); `None` for
/// the migrating and importing marks (`[5461->-id]`).
fn slot_range(field: &str) -> Option<(u16, u16)> {
    if field.starts_with('[') {
        return None;
    }
    match field.split_once('-') {
        Some((from, to)) => Some((from.parse().ok()?, to.parse().ok()?)),
        None => {
            let slot = field.parse().ok()?;
            Some((slot, slot))
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each critical section only assigns a value.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The nodes (`host:port`) of a `CLUSTER NODES` listing flagged failing.
fn failing_nodes(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            flags
                .contains("fail")
                .then(|| fields.get(1)?.split('@').next().map(str::to_owned))?
        })
        .collect()
}

/// The nodes (`host:port`) of a `CLUSTER NODES` listing that are not
/// failing. (Which of them are masters serving slots is for
/// [`Topology::serving`], which weighs the listings by config epoch.)
fn parse_cluster_nodes(listing: &str) -> Vec<String> {
    let mut nodes = Vec::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
            continue;
        };
        if flags.contains("fail") || flags.contains("noaddr") {
            continue;
        }
        let Some(addr) = addr.split('@').next().filter(|a| !a.is_empty()) else {
            continue;
        };
        nodes.push(addr.to_owned());
    }
    nodes
}

/// A Redis Cluster: the client over its seeds, and the nodes seen since,
/// to connect through when every seed is down.
pub struct ClusterTarget {
    /// The first seed's URL: the scheme and credentials of a client over
    /// other nodes.
    template: String,
    /// Each seed's address (`host:port`) and a client over it alone, made
    /// once (a client reads the TLS files when it is made).
    seeds: Vec<(String, ClusterClient)>,
    tls: RedisTls,
    timeout: Duration,
    push: Option<PushHandler>,
    /// The nodes seen.
    known: KnownNodes,
}

impl ClusterTarget {
    /// A cluster found from `seeds` (URLs of one scheme), whose connections
    /// time out after `timeout` and, with `push`, speak RESP3 and hand it
    /// their pushes (see [`connect::cluster_client`]). `known` is shared
    /// with the other targets of the same cluster.
    ///
    /// # Errors
    /// [`LockError::Backend`] when the seeds cannot be used.
    pub fn new(
        seeds: Vec<String>,
        tls: RedisTls,
        timeout: Duration,
        push: Option<PushHandler>,
        known: KnownNodes,
    ) -> Result<Self, LockError> {
        // Checks the seeds (one scheme, usable URLs); connections are made
        // seed by seed (see `connect`).
        connect::cluster_client(&seeds, &tls, timeout, push.as_ref())?;
        let mut clients = Vec::with_capacity(seeds.len());
        for seed in &seeds {
            let Some(addr) = url::Url::parse(seed).ok().and_then(|url| {
                Some(format!(
                    "{}:{}",
                    url.host_str()?,
                    url.port().unwrap_or(6379)
                ))
            }) else {
                continue;
            };
            let client =
                connect::cluster_client(std::slice::from_ref(seed), &tls, timeout, push.as_ref())?;
            clients.push((addr, client));
        }
        Ok(Self {
            seeds: clients,
            template: seeds.first().cloned().unwrap_or_default(),
            tls,
            timeout,
            push,
            known,
        })
    }

    /// A client over `nodes` (`host:port`), with the seeds' scheme,
    /// credentials and TLS settings.
    fn over(&self, nodes: &[String]) -> Option<ClusterClient> {
        let urls: Vec<String> = nodes
            .iter()
            .filter_map(|n| connect::with_address(&self.template, n))
            .collect();
        connect::cluster_client(&urls, &self.tls, self.timeout, self.push.as_ref()).ok()
    }

    /// A connection through the seeds or, when none answers, through the
    /// nodes seen before; then remembers every node the cluster lists.
    /// The seeds are tried side by side, one client each, and the first
    /// that connects wins: the redis crate waits for every initial node of
    /// a client, and a frozen one (SIGSTOP, a partition) accepts the
    /// connection and never answers, which would hold up every new
    /// connection past its time limit. Seeds the cluster flags failing are
    /// left out.
    pub async fn connect(&self) -> Result<ClusterConnection, RedisError> {
        // One client per live seed, raced: the first seed that answers
        // wins, and one that hangs is dropped with the other losers.
        let attempts: Vec<_> = self
            .seeds
            .iter()
            .filter(|(addr, _)| !self.known.is_failing(addr))
            .map(|(_, client)| Box::pin(client.get_async_connection()))
            .collect();
        let first = if attempts.is_empty() {
            Err(RedisError::from((
                redis::ErrorKind::Io,
                "every seed is failing",
            )))
        } else {
            futures_util::future::select_ok(attempts)
                .await
                .map(|(conn, _)| conn)
        };
        let mut conn = match first {
            Ok(conn) => conn,
            Err(e) => {
                let known = self.known.nodes();
                let Some(client) = (!known.is_empty()).then(|| self.over(&known)).flatten() else {
                    return Err(e);
                };
                client.get_async_connection().await?
            }
        };
        if let Ok(listing) = cluster_nodes(&mut conn).await {
            self.known.observe(&listing);
        }
        Ok(conn)
    }
}

/// `CLUSTER NODES`, asked of any node through `conn`.
///
/// # Errors
/// When no node answers.
pub async fn cluster_nodes(conn: &mut ClusterConnection) -> Result<String, RedisError> {
    let listing = conn
        .route_command(
            redis::cmd("CLUSTER").arg("NODES").clone(),
            redis::cluster_routing::RoutingInfo::SingleNode(
                redis::cluster_routing::SingleNodeRoutingInfo::Random,
            ),
        )
        .await?;
    redis::from_redis_value::<String>(listing).map_err(Into::into)
}

/// One connection: to a server, or to a whole cluster. Either is
/// multiplexed, so cloning it shares it.
#[derive(Clone)]
pub enum Conn {
    /// A connection to one server.
    Server(connect::Connection),
    /// Connections to every node of a cluster, routing by key slot, with
    /// the generation of the masters it was opened in (see
    /// [`ClusterView`]).
    Cluster(ClusterConnection, u64),
    /// A connection to the master of a Sentinel set, with the generation
    /// of the master it was opened to (see [`Sentinels`]).
    Master(connect::Connection, u64),
}

impl Conn {
    /// Sets how long a command waits for its answer on this connection.
    /// A cluster connection keeps the timeout it was built with: each of
    /// its node connections is shared by every clone.
    pub fn set_response_timeout(&mut self, timeout: Duration) {
        if let Self::Server(conn) | Self::Master(conn, _) = self {
            conn.set_response_timeout(timeout);
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(conn) | Self::Master(conn, _) => conn.req_packed_command(cmd),
            Self::Cluster(conn, _) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(conn) | Self::Master(conn, _) => {
                conn.req_packed_commands(pipeline, offset, count)
            }
            Self::Cluster(conn, _) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(conn) | Self::Master(conn, _) => conn.get_db(),
            Self::Cluster(conn, _) => conn.get_db(),
        }
    }
}

/// Opens connections to one Redis server or one cluster.
pub struct Connector {
    target: Target,
    /// How long opening a connection may take, and each of its answers.
    timeout: Duration,
    /// Told the server's `run_id` and uptime at every new connection, when
    /// restarts are watched (Redlock's delayed restart).
    restarts: Option<Arc<RestartWatch>>,
}

impl Connector {
    /// A connector for `target`, whose connections open and answer within
    /// `timeout` (a cluster client carries its own). With `restarts`, every
    /// new connection to a server first reads `INFO server` and tells the
    /// watch what it found.
    pub fn new(target: Target, timeout: Duration, restarts: Option<Arc<RestartWatch>>) -> Self {
        Self {
            target,
            timeout,
            restarts,
        }
    }
}

impl Connector {
    /// A new connection to the target: [`managed::Manager::create`].
    async fn open(&self) -> Result<Conn, RedisError> {
        let client = match &self.target {
            Target::Server(client) => client,
            Target::Cluster(cluster) => {
                let generation = cluster.known.generation();
                return Ok(Conn::Cluster(cluster.connect().await?, generation));
            }
            Target::Sentinel(sentinels) => {
                let (client, generation) = sentinels.master().await?;
                let conn = client
                    .connect(self.timeout)
                    .await
                    .inspect_err(|_| sentinels.forget(generation, "cannot connect"))?;
                return Ok(Conn::Master(conn, generation));
            }
        };
        let mut conn = client.connect(self.timeout).await?;
        if let Some(restarts) = &self.restarts {
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await?;
            restarts.observe(&info);
        }
        Ok(Conn::Server(conn))
    }
}

impl managed::Manager for Connector {
    type Type = Conn;
    type Error = RedisError;

    /// Boxed: opening a connection (a cluster's slot map, a Sentinel's
    /// master, TLS) is a large future, and deadpool's `Pool::get` holds
    /// this one inline, so every operation's future would carry (and copy)
    /// it, though a connection is opened once in many operations.
    fn create(&self) -> impl Future<Output = Result<Conn, RedisError>> + Send {
        Box::pin(self.open())
    }

    async fn recycle(&self, conn: &mut Conn, _metrics: &Metrics) -> RecycleResult<RedisError> {
        // A connection to a master that is no longer the master is dropped.
        match (conn, &self.target) {
            (Conn::Master(_, generation), Target::Sentinel(sentinels))
                if *generation != sentinels.generation() =>
            {
                Err(managed::RecycleError::message("the Redis master changed"))
            }
            (Conn::Cluster(_, generation), Target::Cluster(cluster))
                if *generation != cluster.known.generation() =>
            {
                Err(managed::RecycleError::message(
                    "the Redis Cluster's masters changed",
                ))
            }
            _ => Ok(()),
        }
    }
}

/// The pool.
pub type Pool = managed::Pool<Connector>;

/// A pooled connection.
pub type Connection = managed::Object<Connector>;

/// Why no connection could be had.
pub type PoolError = managed::PoolError<RedisError>;

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
a2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922
a3 127.0.0.1:7002@17002 master,fail - 0 0 3 disconnected
b1 127.0.0.1:7003@17003 slave a1 0 0 1 connected
b4 127.0.0.1:7006@17006 master - 0 0 4 connected 10923-16383
b5 127.0.0.1:7007@17007 master - 0 0 0 connected
";

    #[test]
    fn a_listing_gives_the_live_nodes_and_the_masters_that_serve_slots() {
        let nodes = parse_cluster_nodes(LISTING);
        let view = ClusterView::default();
        view.observe(LISTING);
        let masters = view.masters();
        assert_eq!(
            nodes,
            [
                "127.0.0.1:7000",
                "127.0.0.1:7001",
                "127.0.0.1:7003",
                "127.0.0.1:7006",
                "127.0.0.1:7007"
            ]
        );
        assert_eq!(
            masters,
            ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7006"]
        );
        assert_eq!(
            view.shards(),
            [
                (0, "127.0.0.1:7000".to_owned()),
                (5461, "127.0.0.1:7001".to_owned()),
                (10923, "127.0.0.1:7006".to_owned())
            ]
        );
    }

    #[test]
    fn a_promoted_replica_counts_as_a_new_master_and_a_reading_again_does_not() {
        let view = ClusterView::default();
        view.observe(LISTING);
        view.observe(LISTING);
        assert_eq!(view.new_masters(), 0);
        // a1 failed; its replica b1 took over its slots.
        view.observe(
            "\
a1 127.0.0.1:7000@17000 master,fail - 0 0 1 disconnected
a2 127.0.0.1:7001@17001 myself,master - 0 0 2 connected 5461-10922
b1 127.0.0.1:7003@17003 master - 0 0 5 connected 0-5460
b4 127.0.0.1:7006@17006 master - 0 0 4 connected 10923-16383
",
        );
        assert_eq!(
            view.masters(),
            ["127.0.0.1:7001", "127.0.0.1:7003", "127.0.0.1:7006"]
        );
        assert_eq!(view.new_masters(), 1);
        // A node that has not heard of it yet does not count it twice.
        view.observe(LISTING);
        view.observe(
            "b1 127.0.0.1:7003@17003 master - 0 0 5 connected 0-5460\n\
             a2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922\n",
        );
        assert_eq!(view.new_masters(), 1);
        // An empty answer changes nothing.
        view.observe("");
        assert_eq!(view.nodes().len(), 2);
    }

    /// A listing from a node that has not heard of the failover, naming the
    /// killed master again, does not move the view back to it (nor drop
    /// every pooled connection); and the old master, promoted again after
    /// it came back as a replica, counts as a new master.
    #[test]
    fn a_stale_listing_moves_nothing_back_and_a_master_promoted_again_counts_again() {
        let view = ClusterView::default();
        view.observe(LISTING);
        let failed_over = "\
a1 127.0.0.1:7000@17000 master,fail - 0 0 1 disconnected
a2 127.0.0.1:7001@17001 myself,master - 0 0 2 connected 5461-10922
b1 127.0.0.1:7003@17003 master - 0 0 5 connected 0-5460
b4 127.0.0.1:7006@17006 master - 0 0 4 connected 10923-16383
";
        view.observe(failed_over);
        let generation = view.generation();
        let masters = view.masters();
        // A node that still calls a1 the master, with a1's slots.
        view.observe(LISTING);
        assert_eq!(view.masters(), masters, "the stale listing moved a1 back");
        assert_eq!(view.generation(), generation, "nothing changed");
        assert_eq!(view.new_masters(), 1);
        // a1 comes back as b1's replica, then b1 fails and a1 takes over.
        view.observe(
            "a1 127.0.0.1:7000@17000 slave b1 0 0 5 connected\n\
             b1 127.0.0.1:7003@17003 master - 0 0 5 connected 0-5460\n",
        );
        assert_eq!(view.new_masters(), 1);
        view.observe(
            "a1 127.0.0.1:7000@17000 master - 0 0 6 connected 0-5460\n\
             b1 127.0.0.1:7003@17003 master,fail - 0 0 5 disconnected\n",
        );
        assert_eq!(view.new_masters(), 2, "a1 promoted again");
        assert!(view.masters().contains(&"127.0.0.1:7000".to_owned()));
        assert!(!view.masters().contains(&"127.0.0.1:7003".to_owned()));
        // A reshard bumps the epoch of a master that imports slots: not a
        // failover.
        view.observe("a2 127.0.0.1:7001@17001 master - 0 0 7 connected 5000-10922\n");
        assert_eq!(view.new_masters(), 2);
    }

    #[test]
    fn slot_ranges_are_read_and_migration_marks_skipped() {
        assert_eq!(slot_range("0-5460"), Some((0, 5460)));
        assert_eq!(slot_range("5461"), Some((5461, 5461)));
        assert_eq!(slot_range("[5461->-abc]"), None);
        assert_eq!(slot_range("x"), None);
    }
}
