//! The Redis backend, and everything that talks to Redis servers: locks,
//! semaphores and runs in one Redis server, the master a Sentinel set names, or
//! a Redis Cluster (each lock on the master of its slot).
//!
//! # Layout
//! - this file: [`RedisBackend`], the lock primitives (one Lua script
//!   each), and how an operation is retried on a fresh connection;
//! - `semaphores`: the permit primitives; `runs`: the run primitives;
//!   `listing`: the `SCAN` walks; `history`: every name's history (the
//!   fold `scripts/history.lua` runs on each change message) and the
//!   lock's breaks, whose semaphore and run parts sit beside their
//!   other scripts;
//! - `scripts/`: the Lua scripts, loaded with `include_str!`;
//! - [`connect`]: the one place that turns a URL and the TLS settings into
//!   a client, and reports a node it cannot reach over TLS;
//! - `pool`: deadpool's pool over multiplexed (or cluster) connections;
//! - `sentinel`: following the master a Sentinel set names, across
//!   failovers (`+switch-master`, `READONLY`). **Where lockd follows a
//!   failover**: there for Sentinel; for a Redis Cluster, `follow_cluster`
//!   here reads the masters (`CLUSTER NODES`) into the pool's
//!   `ClusterView`; either way the pool drops connections to an old
//!   master, and `run_on` here retries an operation that met a topology
//!   change (`MOVED`, `READONLY`, a dropped connection) on a fresh one and
//!   refuses an answer from before the change;
//! - `events`: the change channels (`channel` builds every channel name)
//!   and their subscribers, which tell the service's listeners: **where a
//!   release reaches the waiters**;
//! - `restart`: Redlock's delayed restart of a node that lost its data;
//! - [`topology`]: the start-up check that the URLs are what
//!   `--redis-mode` says.
//!
//! # Data model
//! Documented in docs/design.md so other clients can interoperate; for
//! lock name `N` and key prefix `P` (default `lockd:`):
//! - `P{N}`: the lock. Its value is exactly the holder's token and its TTL is
//!   the lease.
//! - `P{N}:fence`: the fencing counter: the last fence granted. Each grant
//!   sets it to max(counter + 1, Redis's clock in µs) and gives it a TTL of
//!   `fence_retention_ms`, so a lock name used once leaves nothing behind
//!   once that time has passed (see [`super::fence`]).
//! - `P{N}:meta`: a hash with `fence`, `owner`, `meta`, `granted_at_ms`,
//!   `ttl_ms` (the lock's own TTL, used by an extend that names none) and
//!   `ends_ms` (the lease's end; `owner_now` and `meta_now` when a renewal
//!   gave them, shown in place of the grant's, which the history keeps),
//!   written with the lock and deleted with it by a release or a break;
//!   kept the lock's TTL, plus the fence retention while the history is on
//!   (a lease that ran out is read from it until the next grant writes its
//!   history entry).
//! - `P{N}:history`: a list of the lock's last leases, kept the fence
//!   retention past its last write (see `scripts/history.lua`): a shared
//!   lease's entry from its grant, an exclusive lease's from its end.
//! - `P{N}:shared`, `P{N}:readers` and `P{N}:writers`: the lock's shared
//!   leases (a sorted set of tokens by expiry, and their records), and the
//!   exclusive requests waiting for them to end (see
//!   `scripts/shared.lua`). An exclusive holder and a shared lease are
//!   never live at once.
//! - The channel `P{N}:released`: every script that changes the lock
//!   publishes what it did there, in the same atomic step (`acquired
//!   FENCE TTL GRANTED OWNER`, `extended FENCE TTL AT`, `released FENCE`,
//!   and a probe's marker; see [`super::change`]): `PUBLISH` on one server,
//!   `SPUBLISH` (sharded pub/sub) on a Redis Cluster. Each lockd instance
//!   wakes its first waiter for that lock, and its watches follow it.
//!
//! The braces are a Redis Cluster hash tag: all three keys of a lock (and
//! its channel) live in one slot, so each script touches a single node and
//! its `SPUBLISH` stays within that node's shard. The name rules refuse
//! braces in names and in the key prefix, so nothing in a name can move a
//! key out of that slot.
//!
//! Every lease operation is one Lua script, run by SHA through
//! [`redis::Script`], which loads the script again after `NOSCRIPT` (Redis
//! restarted, or `SCRIPT FLUSH`). A single Redis loses locks that were not
//! yet replicated when it fails over; use Redlock for that.
//!
//! A TLS failure is reported by [`connect`], once per node, and answered
//! as [`LockError::Unavailable`].

use crate::lock::LaggingWrite;
use crate::lock::ProbedLock;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use deadpool::Runtime;
use redis::{FromRedisValue, Script, ScriptInvocation};

use self::connect::{ConnectReport, RedisTls};
use self::events::{ChannelEvents, ShardedEvents};
use self::pool::{
    ClusterTarget, Conn, Connection, Connector, KnownNodes, Pool, PoolError, Target, cluster_nodes,
};
use futures_util::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::restart::RestartWatch;
use self::sentinel::Sentinels;
use super::history::{BrokenLease, HistoryEntry, HistoryLength};
use super::listing::{NamePrefix, PageSize, Position, ScanPage};
use super::reaper::{Attempt, Reap, Reaped};
use super::run::ProbedRun;
use super::run::{
    Attempt as RunAttempt, Completed, RunInfo, RunMiss, RunResult, StartRefusal, StartRequest,
    Started,
};
use super::semaphore::{Permit, PermitInfo, PermitOutcome, PermitRequest, Refusal, SemaphoreInfo};
use super::{
    AcquireRequest, Acquired, ChangeListener, ExtendTtl, Kind, Lease, LeaseLeft, LockError,
    LockInfo, LockName, LockNode, Meta, Mode, Node, Released, RunNode, SemaphoreNode, Subject,
    Token, Ttl, WaitInterest, unix_millis,
};
use crate::backoff::ExponentialBackoff;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};

pub mod connect;
mod events;
mod history;
mod listing;
mod pool;
mod restart;
mod runs;
mod semaphores;
mod sentinel;
pub mod topology;

/// The fencing rule (`next_fence`), put in front of the scripts that give
/// fences.
const FENCE_LUA: &str = include_str!("scripts/fence.lua");

/// The shared-lease rules: `tell` (`scripts/tell.lua`), the permit
/// helpers (`scripts/semaphore.lua`) and the shared-lease ones they serve
/// (`scripts/shared.lua`).
const SHARED_RULES: &str = concat!(
    include_str!("scripts/tell.lua"),
    include_str!("scripts/semaphore.lua"),
    include_str!("scripts/shared.lua")
);

/// The history and the shared-lease rules: put in front of every lock
/// script but the exclusive lease's own (which has the rules after its
/// own path, see [`exclusive_source`]), since every one of them must see
/// the shared leases.
static SHARED_LUA: LazyLock<String> =
    LazyLock::new(|| format!("{}{SHARED_RULES}", history::HISTORY_LUA));

/// The line of `acquire.lua`, `release.lua` and `extend.lua` that the
/// shared-lease rules take the place of: `tell.lua`, `semaphore.lua` and
/// `shared.lua`, after the path of a lock that was never shared (or of
/// its exclusive holder), so that path does not pay for defining them
/// (each Lua function is made anew at every call of a script).
const SHARED_RULES_AT: &str = "-- @shared-rules\n";

/// An exclusive lease's script: `fence.lua` (when it gives fences), the
/// history, and `body` with the shared-lease rules in place of its
/// [`SHARED_RULES_AT`] line.
fn exclusive_script(fence: bool, body: &str) -> Script {
    Script::new(&exclusive_source(fence, body))
}

/// The Lua of [`exclusive_script`].
fn exclusive_source(fence: bool, body: &str) -> String {
    format!(
        "{}{}{}",
        if fence { FENCE_LUA } else { "" },
        history::HISTORY_LUA,
        body.replacen(SHARED_RULES_AT, SHARED_RULES, 1)
    )
}

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| exclusive_script(true, include_str!("scripts/acquire.lua")));
static ACQUIRE_SHARED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{FENCE_LUA}{}{}",
        *SHARED_LUA,
        include_str!("scripts/shared_acquire.lua")
    ))
});
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| exclusive_script(false, include_str!("scripts/release.lua")));
static HANDOFF: LazyLock<Script> = LazyLock::new(|| Script::new(&handoff_source()));

/// The Lua of [`HANDOFF`]: `fence.lua`, the history, `release.lua` and
/// `acquire.lua` each made a function of its own `KEYS` and `ARGV` (with
/// the shared-lease rules in their place), then `handoff.lua`, which
/// calls them one after the other.
fn handoff_source() -> String {
    let part = |name: &str, body: &str| {
        format!(
            "local function {name}(KEYS, ARGV)\n{}\nend\n",
            body.replacen(SHARED_RULES_AT, SHARED_RULES, 1)
        )
    };
    format!(
        "{FENCE_LUA}{}{}{}{}",
        history::HISTORY_LUA,
        part("release_part", include_str!("scripts/release.lua")),
        part("acquire_part", include_str!("scripts/acquire.lua")),
        include_str!("scripts/handoff.lua")
    )
}
static EXTEND: LazyLock<Script> =
    LazyLock::new(|| exclusive_script(true, include_str!("scripts/extend.lua")));
static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/raise_fence.lua")));
const INSPECT_LUA: &str = include_str!("scripts/inspect.lua");
/// A watcher's marker (`probe.lua`), put in front of an inspect script.
const PROBE_LUA: &str = include_str!("scripts/probe.lua");
static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{}{INSPECT_LUA}", *SHARED_LUA)));
/// A lock's probe: the marker, the holder as `inspect.lua` reads it, and
/// the fence counter (`KEYS[3]`) after it, in one step.
static PROBE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{}{PROBE_LUA}local function read_holder()\n{INSPECT_LUA}\nend\n\
         local read = read_holder()\n\
         read[#read + 1] = redis.call('GET', KEYS[3]) or ''\n\
         return read\n",
        *SHARED_LUA
    ))
});

/// What a [`RedisBackend`] talks to.
#[derive(Clone)]
pub enum Endpoint {
    /// One Redis server, by its `redis://` (or `rediss://`) URL.
    Server(String),
    /// A Redis Cluster, by the URLs of some of its nodes (seeds); lockd
    /// discovers the rest.
    Cluster(Vec<String>),
    /// The master that Sentinels (by their URLs) monitor under `master`.
    Sentinel {
        /// The Sentinels' URLs.
        sentinels: Vec<String>,
        /// The name they monitor the master by.
        master: String,
    },
}

impl Endpoint {
    /// The URLs given: the server's, or the seeds'.
    pub fn urls(&self) -> &[String] {
        match self {
            Self::Server(url) => std::slice::from_ref(url),
            Self::Cluster(seeds)
            | Self::Sentinel {
                sentinels: seeds, ..
            } => seeds,
        }
    }
}

/// How to reach one Redis server or one cluster.
#[derive(Clone)]
pub struct RedisConfig {
    /// The server or cluster. Its URLs may carry a password: never log them
    /// (see [`connect::redact_url`]).
    pub endpoint: Endpoint,
    /// The CA and client certificates for `rediss://` URLs.
    pub tls: RedisTls,
    /// Where TLS failures to reach this server (or cluster) are reported:
    /// shared with the start-up probe, so that each is logged once.
    pub report: Arc<ConnectReport>,
    /// The prefix of every key lockd writes, such as `lockd:`.
    pub key_prefix: String,
    /// The longest time one operation may take, connecting included. Past it
    /// the operation fails with [`LockError::Unavailable`].
    pub timeout: Duration,
    /// The most pooled connections.
    pub pool_size: usize,
    /// How long a fencing counter is kept after a lock's last grant (and
    /// a name's history after its last lease).
    pub fence_retention: Duration,
    /// How many entries each name's history keeps (0: none).
    pub history_length: HistoryLength,
    /// Redlock: how long this node counts toward no quorum after it
    /// restarted (see `restart`); `None` outside Redlock, where
    /// restarts are not watched.
    pub restart_delay: Option<Duration>,
    /// How many replicas must acknowledge each grant, extend and release (`WAIT`
    /// on the connection that wrote it); 0: none.
    pub min_replicas_acked: usize,
    /// How long to wait for them.
    pub replica_ack_timeout: Duration,
    /// Whether this server is the whole store (single-Redis mode), rather
    /// than a Redlock node. The whole store compare-and-deletes, in the
    /// background, an acquire that timed out with a token lockd generated,
    /// once it has surely run or failed, and answers no lease that arrived
    /// with nothing left (it deletes such a grant at once). Redlock, whose
    /// waiters may retry the same token on a node and which computes its
    /// own validity, cleans up its nodes itself.
    pub standalone: bool,
}

/// The Redis keys of one lock.
struct Keys {
    lock: String,
    fence: String,
    meta: String,
    /// Its shared leases, their records, and the exclusive requests
    /// waiting for them (see `scripts/shared.lua`).
    shared: String,
    readers: String,
    writers: String,
    released: String,
    /// Its history (see `scripts/history.lua`).
    history: String,
}

impl Keys {
    fn new(prefix: &str, name: &LockName) -> Self {
        let lock = joined(&[prefix, "{", name.as_str(), "}"]);
        Self {
            fence: joined(&[&lock, ":fence"]),
            meta: joined(&[&lock, ":meta"]),
            shared: joined(&[&lock, ":shared"]),
            readers: joined(&[&lock, ":readers"]),
            writers: joined(&[&lock, ":writers"]),
            history: joined(&[&lock, ":history"]),
            released: events::channel(prefix, Kind::Lock, name),
            lock,
        }
    }
}

/// `parts` one after the other: a key name. What `format!` would make,
/// without its formatting machinery (measured: 16 key names a lock cycle
/// took about 17,000 instructions through `format!`, docs/performance.md).
fn joined(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        out.push_str(part);
    }
    out
}

/// Where a backend hears release events (see [`self::events`]).
#[derive(Clone)]
enum EventSource {
    /// `SUBSCRIBE` on the server (or the Sentinels' master), subject by
    /// subject; the scripts `PUBLISH`.
    Channel(Arc<[connect::Client]>),
    /// Sharded pub/sub on a cluster, lock by lock; the scripts `SPUBLISH`.
    Sharded {
        seeds: Vec<String>,
        tls: RedisTls,
        /// Shared with the pool's target.
        known: KnownNodes,
    },
}

impl EventSource {
    /// The command the scripts publish releases with.
    fn publish(&self) -> &'static str {
        match self {
            Self::Channel(_) => "PUBLISH",
            Self::Sharded { .. } => "SPUBLISH",
        }
    }
}

/// Locks held in one Redis server or one Redis Cluster, through a deadpool
/// connection pool. Cloning it shares the pool.
#[derive(Clone)]
pub struct RedisBackend {
    pool: Pool,
    /// TLS failures to reach the server or cluster, logged once.
    report: Arc<ConnectReport>,
    /// Where release events are heard (not through the pool).
    events: EventSource,
    /// Whether this is a cluster (readiness reads `CLUSTER INFO`).
    cluster: bool,
    /// The Sentinels, in Sentinel mode: the master is theirs to name.
    sentinels: Option<Arc<Sentinels>>,
    /// Replicas that must acknowledge each write (see [`RedisConfig`]).
    min_replicas_acked: usize,
    replica_ack_timeout: Duration,
    prefix: String,
    timeout: Duration,
    fence_retention_ms: u64,
    history_length: HistoryLength,
    restarts: Option<Arc<RestartWatch>>,
    standalone: bool,
}

impl RedisBackend {
    /// Builds the backend. No connection is opened until the first
    /// operation, so lockd starts while Redis is down and recovers when it
    /// comes back.
    ///
    /// # Errors
    /// When the URL cannot be parsed or the pool cannot be built.
    pub fn new(config: &RedisConfig) -> Result<Self, LockError> {
        let clients = config
            .endpoint
            .urls()
            .iter()
            .map(|url| connect::client(url, &config.tls))
            .collect::<Result<Vec<_>, _>>()?;
        let restarts = match (&config.restart_delay, clients.as_slice()) {
            (Some(delay), [client]) => {
                let node = client.connection_info().addr().to_string();
                Some(Arc::new(RestartWatch::new(node, *delay)))
            }
            _ => None,
        };
        let sentinels = match &config.endpoint {
            Endpoint::Sentinel { sentinels, master } => Some(Arc::new(Sentinels::new(
                sentinels,
                master,
                config.timeout,
                &config.tls,
            )?)),
            _ => None,
        };
        let known_nodes = KnownNodes::default();
        let target = match &config.endpoint {
            Endpoint::Server(_) => Target::Server(Box::new(clients[0].clone())),
            Endpoint::Sentinel { .. } => Target::Sentinel(
                sentinels
                    .clone()
                    .ok_or_else(|| LockError::Backend("no Sentinels".into()))?,
            ),
            Endpoint::Cluster(seeds) => Target::Cluster(Box::new(ClusterTarget::new(
                seeds.clone(),
                config.tls.clone(),
                config.timeout,
                None,
                known_nodes.clone(),
            )?)),
        };
        let cluster = matches!(config.endpoint, Endpoint::Cluster(_));
        let events = match &config.endpoint {
            Endpoint::Cluster(seeds) => EventSource::Sharded {
                seeds: seeds.clone(),
                tls: config.tls.clone(),
                known: known_nodes,
            },
            _ => EventSource::Channel(clients.into()),
        };
        let pool = Pool::builder(Connector::new(target, config.timeout, restarts.clone()))
            .max_size(config.pool_size)
            // The connection handed back last goes out first, so that
            // operations that share connections share the same one (and
            // Redis reads their scripts together), rather than spreading
            // over every connection ever opened.
            .queue_mode(deadpool::managed::QueueMode::Lifo)
            .wait_timeout(Some(config.timeout))
            .create_timeout(Some(config.timeout))
            .recycle_timeout(Some(config.timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| LockError::Backend(format!("cannot build the Redis pool: {e}")))?;
        Ok(Self {
            pool,
            report: config.report.clone(),
            events,
            cluster,
            sentinels,
            min_replicas_acked: config.min_replicas_acked,
            replica_ack_timeout: config.replica_ack_timeout,
            prefix: config.key_prefix.clone(),
            timeout: config.timeout,
            fence_retention_ms: u64::try_from(config.fence_retention.as_millis())
                .unwrap_or(u64::MAX),
            history_length: config.history_length,
            restarts,
            standalone: config.standalone,
        })
    }

    /// Whether this node is in its restart delay (Redlock), for the gauge.
    pub fn in_restart_delay(&self) -> bool {
        self.restarts.as_ref().is_some_and(|r| r.delayed())
    }

    /// The Sentinels that name the master, in Sentinel mode (for the
    /// gauges of the master and its changes).
    pub fn sentinels(&self) -> Option<Arc<Sentinels>> {
        self.sentinels.clone()
    }

    /// What is known of the cluster's nodes, in cluster mode (for the
    /// gauge of its masters).
    pub fn cluster_view(&self) -> Option<KnownNodes> {
        match &self.events {
            EventSource::Sharded { known, .. } => Some(known.clone()),
            EventSource::Channel(_) => None,
        }
    }

    /// The pool, for gauges read at scrape time.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Runs a script within the operation timeout. A connection that broke
    /// (Redis restarted) is thrown away and the script is sent once more on a
    /// fresh one; every script here is safe to repeat.
    async fn run<T: FromRedisValue>(&self, call: &ScriptInvocation<'_>) -> Result<T, LockError> {
        self.run_on(call, &mut None).await
    }

    /// [`Self::run`], leaving in `sent_on` the connection that carried the
    /// script last, so that a call that timed out can be followed on the
    /// same connection: Redis runs one connection's commands in order.
    async fn run_on<T: FromRedisValue>(
        &self,
        call: &ScriptInvocation<'_>,
        sent_on: &mut Option<Conn>,
    ) -> Result<T, LockError> {
        let attempt = async {
            let mut retried = false;
            let mut topology_pauses = TOPOLOGY_BACKOFF.pauses();
            loop {
                let pooled = self.pool.get().await.map_err(|e| self.pool_error(e))?;
                let mut conn = (*pooled).clone();
                // When shared, back to the pool at once: concurrent
                // operations send their scripts on one connection, pipelined.
                let mut held = (!self.shares_connections()).then_some(pooled);
                *sent_on = Some(conn.clone());
                let answer = call.invoke_async(&mut conn).await;
                if let (Some(sentinels), Conn::Master(_, generation)) = (&self.sentinels, &conn) {
                    let generation = *generation;
                    if matches!(&answer, Err(e) if e.code() == Some("READONLY")) {
                        sentinels.forget(generation, "READONLY");
                    }
                    if sentinels.generation() != generation {
                        // The master changed while the script ran: its
                        // answer may come from a node that is no longer
                        // the master, where a write is lost.
                        self.discard(held.take());
                        return Err(LockError::Unavailable(
                            "the Redis master changed during the operation".into(),
                        ));
                    }
                }
                if let (Some(view), Conn::Cluster(_, generation)) = (self.cluster_view(), &conn)
                    && view.generation() != *generation
                {
                    // The masters changed since this connection's slot map
                    // was read: its answer may come from a master that was
                    // replaced (frozen, then answering again), where a
                    // write is lost.
                    self.discard(held.take());
                    if answer.is_ok() {
                        return Err(LockError::Unavailable(
                            "the Redis Cluster's masters changed during the operation".into(),
                        ));
                    }
                    topology_pauses.wait().await;
                    continue;
                }
                match answer {
                    Ok(value) => {
                        self.report.connected();
                        return Ok(value);
                    }
                    // The cluster is moving slots or failing over, and the
                    // node did not run the script: wait a moment and send
                    // it again on a fresh connection (a fresh slot map),
                    // while the operation's time lasts.
                    Err(e) if is_topology_change(&e) => {
                        self.discard(held.take());
                        topology_pauses.wait().await;
                    }
                    Err(e) if !retried && (e.is_io_error() || e.is_connection_dropped()) => {
                        if let (Some(sentinels), Conn::Master(_, generation)) =
                            (&self.sentinels, &conn)
                        {
                            sentinels.forget(*generation, "connection lost");
                        }
                        if e.is_timeout() {
                            return Err(self.error(&e));
                        }
                        // Redis went away: the idle connections are as dead
                        // as this one. Throw them all out, so that the retry
                        // connects afresh.
                        self.discard(held.take());
                        self.pool.retain(|_, _| false);
                        retried = true;
                    }
                    // The node was demoted. A fresh connection may reach
                    // the new master (a managed service's endpoint moves
                    // to it; Sentinel mode asks again, above).
                    Err(e) if e.code() == Some("READONLY") => {
                        self.discard(held.take());
                        return Err(self.error(&e));
                    }
                    Err(e) => return Err(self.error(&e)),
                }
            }
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .map_err(|_| {
                LockError::Unavailable(format!("no answer from Redis in {:?}", self.timeout))
            })?
    }

    /// Whether operations share pooled connections rather than hold one
    /// each. They share unless replicas must acknowledge writes: `WAIT`
    /// blocks its connection in Redis, and would hold up every operation
    /// sent on it behind its timeout. A multiplexed connection carries
    /// concurrent operations in order, and Redis reads the scripts sent
    /// together in one read: fewer system calls in lockd and in Redis per
    /// operation than one connection each (see docs/performance.md).
    fn shares_connections(&self) -> bool {
        self.min_replicas_acked == 0
    }

    /// Takes a connection that must not be used again out of the pool:
    /// `held`, the pooled connection this operation holds, or, when it
    /// shares connections (and so holds none), every idle one: the broken
    /// one is among them.
    fn discard(&self, held: Option<Connection>) {
        match held {
            Some(conn) => drop(Connection::take(conn)),
            None => {
                self.pool.retain(|_, _| false);
            }
        }
    }

    /// How many replicas acknowledged every write made so far on `conn`
    /// (Redis `WAIT`, sent to the master that holds `key`), waiting up to
    /// the ack timeout for [`RedisConfig::min_replicas_acked`] of them.
    ///
    /// # Errors
    /// When the `WAIT` itself fails (the connection broke).
    async fn replicas_acked(&self, conn: &mut Conn, key: &str) -> Result<usize, LockError> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.min_replicas_acked)
            .arg(u64::try_from(self.replica_ack_timeout.as_millis()).unwrap_or(u64::MAX));
        let acked: i64 = match conn {
            // A cluster routes WAIT to every master by default; only the
            // master of this key's slot holds the write.
            Conn::Cluster(cluster, _) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let value = cluster
                    .route_command(
                        wait,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await
                    .map_err(|e| LockError::Unavailable(format!("WAIT failed: {e}")))?;
                // An error here (the slot map moved between the script and
                // the WAIT, which then reached a replica) leaves the count
                // unknown: as good as none.
                redis::from_redis_value(value)
                    .map_err(|e| LockError::Unavailable(format!("WAIT answered {e}")))?
            }
            // A refusal (the node was demoted between the script and the
            // WAIT) leaves the count unknown too.
            _ => wait
                .query_async(conn)
                .await
                .map_err(|e| LockError::Unavailable(format!("WAIT failed: {e}")))?,
        };
        Ok(usize::try_from(acked).unwrap_or(0))
    }

    /// After a write on `conn` (a grant or a new lease, of a lock or a
    /// permit, whose keys `key` routes to), whether enough replicas
    /// acknowledged it: `Ok` when [`RedisConfig::min_replicas_acked`] is 0
    /// or met. A new grant that falls short is undone with its release
    /// script (`undo`), on the same connection (whose slot map found the
    /// node that granted it): at once when it answers in time, else in the
    /// background for as long as the lease may last.
    async fn check_replicas(
        &self,
        conn: Option<Conn>,
        key: &str,
        undo: Option<(Grant, ScriptInvocation<'static>)>,
        otherwise: LaggingWrite,
    ) -> Result<(), LockError> {
        if self.min_replicas_acked == 0 {
            return Ok(());
        }
        let Some(mut conn) = conn else {
            return Err(LockError::Unavailable(
                "no connection to wait for replicas on".into(),
            ));
        };
        let short = match self.replicas_acked(&mut conn, key).await {
            Ok(acked) if acked >= self.min_replicas_acked => return Ok(()),
            Ok(acked) => LockError::ReplicationLagging {
                acked,
                needed: self.min_replicas_acked,
                write: if undo.is_some() {
                    LaggingWrite::GrantUndone
                } else {
                    otherwise
                },
            },
            Err(e) => e,
        };
        if let Some((grant, call)) = undo {
            // Nothing is held that a failover could lose, nor handed out.
            let undone = tokio::time::timeout(
                self.timeout,
                call.invoke_async::<Vec<redis::Value>>(&mut conn),
            )
            .await;
            if !matches!(undone, Ok(Ok(_))) {
                let this = self.clone();
                tokio::spawn(async move { this.reap_timed_out(grant, call, conn).await });
            }
        }
        Err(short)
    }

    /// `e` as a lock error, reported first: a TLS failure is logged (once)
    /// and is always [`LockError::Unavailable`], as a server that cannot be
    /// reached is.
    fn error(&self, e: &redis::RedisError) -> LockError {
        if self.report.failed(e) {
            LockError::Unavailable(e.to_string())
        } else {
            redis_error(e)
        }
    }

    /// [`Self::error`] for a connection the pool could not make.
    fn pool_error(&self, e: PoolError) -> LockError {
        match e {
            PoolError::Backend(e) => self.error(&e),
            other => LockError::Unavailable(other.to_string()),
        }
    }

    /// The inspect script of lock `name`.
    fn inspect_call(&self, name: &LockName) -> ScriptInvocation<'static> {
        let keys = Keys::new(&self.prefix, name);
        let mut call = INSPECT.prepare_invoke();
        call.key(&keys.lock)
            .key(&keys.meta)
            .key(&keys.fence)
            .key(&keys.shared)
            .key(&keys.readers)
            .key(&keys.writers);
        call
    }

    /// The release script for `token` on `name`.
    fn release_call(&self, keys: &Keys, token: &Token) -> ScriptInvocation<'static> {
        let mut call = RELEASE.prepare_invoke();
        call.key(&keys.lock)
            .key(&keys.meta)
            .key(&keys.shared)
            .key(&keys.readers)
            .key(&keys.writers)
            .arg(token.expose())
            .arg(&keys.released)
            .arg(self.events.publish());
        self.with_history(&mut call, &keys.history);
        call
    }

    /// `script` (acquire.lua's or one that begins with its arguments)
    /// with `req`'s keys and arguments, sent at `sent` (`sent_wall` by
    /// the wall clock): the history tail is the caller's to add.
    fn acquire_call(
        &self,
        script: &'static Script,
        keys: &Keys,
        req: &AcquireRequest,
        sent: Instant,
        sent_wall: SystemTime,
    ) -> ScriptInvocation<'static> {
        // How much longer the request waits, in whole ms ('' when it does
        // not): a waiting writer keeps new shared leases out that long.
        let waits_ms = req
            .waits_until
            .map(|until| {
                until
                    .saturating_duration_since(sent)
                    .as_millis()
                    .to_string()
            })
            .unwrap_or_default();
        let ttl_ms = req.ttl.as_millis();
        let mut call = script.prepare_invoke();
        call.key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.meta)
            .key(&keys.shared)
            .key(&keys.readers)
            .key(&keys.writers)
            .arg(req.token.expose())
            .arg(ttl_ms)
            .arg(req.owner.as_ref().map_or("", |o| o.as_str()))
            .arg(unix_millis(sent_wall))
            .arg(self.fence_retention_ms)
            .arg(&keys.released)
            .arg(self.events.publish())
            .arg(waits_ms)
            .arg(if req.renew_only { "1" } else { "" })
            .arg(req.meta.as_ref().map_or("", |m| m.as_str()))
            .arg(unix_millis(sent_wall).saturating_add(ttl_ms))
            .arg(self.holder_keep_ms(ttl_ms));
        call
    }

    /// The grant `req` makes, and the release script that undoes it.
    fn lock_undo(&self, keys: &Keys, req: &AcquireRequest) -> (Grant, ScriptInvocation<'static>) {
        let grant = Grant {
            kind: GrantKind::Lock,
            name: req.name.clone(),
            ttl: req.ttl,
        };
        (grant, self.release_call(keys, &req.token))
    }

    /// After a grant's script failed with `e`, sent on `sent_on`: a script
    /// held up in a stalled Redis may still grant, so a grant under a token
    /// lockd generated (`undo`: the grant and its release script) is undone
    /// in the background ([`Self::reap_timed_out`]). A Redlock node leaves
    /// that to Redlock.
    fn undo_if_stalled(
        &self,
        e: &LockError,
        sent_on: Option<Conn>,
        token_generated: bool,
        undo: impl FnOnce() -> (Grant, ScriptInvocation<'static>),
    ) {
        if let (true, Some(conn), true) = (
            e.is_transient(),
            sent_on,
            self.standalone && token_generated,
        ) {
            let ((grant, call), this) = (undo(), self.clone());
            tokio::spawn(async move { this.reap_timed_out(grant, call, conn).await });
        }
    }

    /// After an acquire of `req` that timed out, removes the grant it may
    /// still make. The compare-and-delete is sent on the connection that
    /// carried the acquire, so Redis runs it after the acquire, however long
    /// Redis stalls: it waits for that answer for as long as the connection
    /// lives. Once any answer arrived, the acquire has run (or never will),
    /// and its lease ends within one TTL. When the connection breaks
    /// instead, a script Redis ran before that also ends within one TTL, so
    /// the delete is retried on fresh connections for that long.
    ///
    /// `undo` is the release script of the grant (a lock's or a permit's),
    /// whose answer starts with 1 when it released something.
    async fn reap_timed_out(&self, grant: Grant, undo: ScriptInvocation<'static>, mut conn: Conn) {
        let call = undo;
        // As long as a stalled Redis takes: the answer must come after the
        // acquire's.
        conn.set_response_timeout(REAP_PATIENCE);
        // The first attempt goes on the acquire's connection, the retries
        // (after it broke, or Redis answered with an error such as a busy
        // script, by which time the acquire has run) on fresh ones, while
        // its lease may last.
        let first = std::sync::Mutex::new(Some(conn));
        let reap = Reap::at_once(grant.ttl.as_duration());
        let outcome = reap
            .run(None, || {
                let conn = first.lock().unwrap_or_else(|p| p.into_inner()).take();
                let (call, grant) = (&call, &grant);
                async move {
                    let answer = match conn {
                        Some(mut conn) => call
                            .invoke_async::<Vec<redis::Value>>(&mut conn)
                            .await
                            .map_err(|e| self.error(&e)),
                        None => self.run::<Vec<redis::Value>>(call).await,
                    };
                    match answer {
                        // 1: a lock or a permit released; 2: a shared lease.
                        Ok(answer)
                            if matches!(
                                answer.first(),
                                Some(&redis::Value::Int(1) | &redis::Value::Int(2))
                            ) =>
                        {
                            grant.released_timed_out();
                            Attempt::Done
                        }
                        // Nobody or another token holds it: the acquire did
                        // not grant, or its lease already ran out.
                        Ok(_) => Attempt::Done,
                        Err(e) => Attempt::Retry(e),
                    }
                }
            })
            .await;
        if let Reaped::GaveUp(_) = outcome {
            match grant.kind {
                GrantKind::Lock => {
                    tracing::warn!(lock = %grant.name, "could not delete a lock whose grant timed out; it runs out with its TTL")
                }
                GrantKind::Permit => {
                    tracing::warn!(semaphore = %grant.name, "could not give back a permit whose grant timed out; it runs out with its TTL")
                }
                GrantKind::Attempt => {
                    tracing::warn!(run = %grant.name, "could not abandon a run's attempt whose start timed out; it runs out with its TTL")
                }
            }
        }
    }
}

/// How long the background delete of a grant that timed out waits for
/// Redis's answer on the connection that carried the grant: as long as a
/// stalled Redis may take, short of for ever.
const REAP_PATIENCE: Duration = Duration::from_secs(24 * 3600);

/// The pauses between the tries of a script the cluster answered with a
/// topology change (see [`is_topology_change`]): 20 ms doubling up to
/// 200 ms, within the operation's timeout.
const TOPOLOGY_BACKOFF: ExponentialBackoff =
    ExponentialBackoff::new(Duration::from_millis(20), Duration::from_millis(200));

/// Whether a cluster answered that the slot is moving or has no master
/// yet (`MOVED` or `ASK` that the cluster connection did not follow,
/// `TRYAGAIN`, `CLUSTERDOWN`): the node did not run the command, and a try
/// a moment later may succeed.
fn is_topology_change(e: &redis::RedisError) -> bool {
    matches!(e.code(), Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN"))
}

/// A grant whose answer timed out, to undo in the background.
struct Grant {
    kind: GrantKind,
    name: LockName,
    ttl: Ttl,
}

#[derive(Clone, Copy)]
enum GrantKind {
    Lock,
    Permit,
    Attempt,
}

impl Grant {
    fn released_timed_out(&self) {
        match self.kind {
            GrantKind::Lock => {
                tracing::info!(lock = %self.name, "released a lock whose grant timed out");
            }
            GrantKind::Permit => {
                tracing::info!(semaphore = %self.name, "gave back a permit whose grant timed out");
            }
            GrantKind::Attempt => {
                tracing::info!(run = %self.name, "abandoned a run's attempt whose start timed out");
            }
        }
    }
}

/// Sorts a Redis error: could not reach or hear from Redis (retry may cure
/// it), or Redis refused (it will not).
fn redis_error(e: &redis::RedisError) -> LockError {
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(
            e.code(),
            Some(
                "LOADING"
                    | "BUSY"
                    | "TRYAGAIN"
                    | "MASTERDOWN"
                    | "CLUSTERDOWN"
                    | "READONLY"
                    | "MOVED"
                    | "ASK"
            )
        );
    if transient {
        LockError::Unavailable(e.to_string())
    } else {
        LockError::Backend(e.to_string())
    }
}

/// What a refused holder has left, from the `PTTL` a script read: no end
/// for -1 (a key a foreign client set without a TTL), else at least 1 ms
/// (-2, a key gone by the answer, included).
fn lease_left(pttl: i64) -> LeaseLeft {
    match pttl {
        -1 => LeaseLeft::NoTtl,
        ms => LeaseLeft::AtMost(Duration::from_millis(u64::try_from(ms).unwrap_or(0).max(1))),
    }
}

#[async_trait]
impl Node for RedisBackend {
    fn counts_for_quorum(&self) -> bool {
        !self.in_restart_delay()
    }

    async fn scan(
        &self,
        kind: Kind,
        prefix: &NamePrefix,
        at: &Position,
        limit: PageSize,
    ) -> Result<ScanPage, LockError> {
        RedisBackend::scan(self, kind, prefix, at, limit).await
    }

    async fn history(&self, subject: &Subject) -> Result<Vec<HistoryEntry>, LockError> {
        match subject.kind() {
            Kind::Lock => self.lock_history(subject.name()).await,
            Kind::Semaphore => self.semaphore_history(subject.name()).await,
            Kind::Run => self.run_history(subject.name()).await,
        }
    }

    async fn break_leases(
        &self,
        subject: &Subject,
        fence: Option<u64>,
        by: &str,
    ) -> Result<Vec<BrokenLease>, LockError> {
        let name = subject.name();
        match subject.kind() {
            Kind::Lock => self.break_lock(name, fence, by).await,
            Kind::Semaphore => self.break_permits(name, fence, by).await,
            Kind::Run => self.break_attempt(name, fence, by).await,
        }
    }

    async fn ping(&self) -> Result<(), LockError> {
        let attempt = async {
            let mut conn = self.pool.get().await.map_err(|e| self.pool_error(e))?;
            if !self.cluster {
                return redis::cmd("PING")
                    .query_async::<String>(&mut *conn)
                    .await
                    .map(|_| self.report.connected())
                    .map_err(|e| self.error(&e));
            }
            // A cluster answers while some slots have no master; it is
            // ready only when every slot is served.
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut *conn)
                .await
                .map_err(|e| self.error(&e))?;
            self.report.connected();
            if info.lines().any(|l| l.trim() == "cluster_state:ok") {
                Ok(())
            } else {
                Err(LockError::Unavailable(
                    "the Redis Cluster reports cluster_state:fail".into(),
                ))
            }
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .map_err(|_| LockError::Unavailable("PING timed out".into()))?
    }

    fn watch_releases(
        &self,
        listener: Arc<dyn ChangeListener>,
        stop: CancellationToken,
    ) -> Option<Arc<dyn WaitInterest>> {
        if let Some(sentinels) = self.sentinels.clone() {
            let stop = stop.clone();
            tokio::spawn(async move { sentinels.follow(stop).await });
        }
        if let EventSource::Sharded { known, .. } = &self.events {
            let (pool, view, timeout) = (self.pool.clone(), known.clone(), self.timeout);
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = follow_cluster(pool, view, timeout) => {}
                    () = stop.cancelled() => {}
                }
            });
        }
        let (run, interest): (BoxFuture<'static, ()>, _) = match &self.events {
            EventSource::Channel(clients) => {
                let (events, interest) = ChannelEvents::new(
                    clients.clone(),
                    self.sentinels.clone(),
                    self.report.clone(),
                    &self.prefix,
                    self.timeout,
                    listener,
                );
                (Box::pin(events.run()), Some(interest))
            }
            EventSource::Sharded { seeds, tls, known } => {
                let made = ShardedEvents::new(
                    seeds.clone(),
                    tls.clone(),
                    known.clone(),
                    listener,
                    &self.prefix,
                    self.report.clone(),
                    self.timeout,
                );
                match made {
                    Ok((events, interest)) => (Box::pin(events.run()), Some(interest)),
                    Err(e) => {
                        // The pool's target was built from the same seeds.
                        tracing::error!(error = %e, "no release events: waiters wake at lease expiry only");
                        return None;
                    }
                }
            }
        };
        tokio::spawn(async move {
            tokio::select! {
                () = run => {}
                () = stop.cancelled() => {}
            }
        });
        interest
    }
}

#[async_trait]
impl LockNode for RedisBackend {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired, LockError> {
        let keys = Keys::new(&self.prefix, &req.name);
        let (sent, sent_wall) = (Instant::now(), SystemTime::now());
        let script = match req.mode {
            Mode::Exclusive => &ACQUIRE,
            Mode::Shared => &ACQUIRE_SHARED,
        };
        let mut call = self.acquire_call(script, &keys, req, sent, sent_wall);
        self.with_history(&mut call, &keys.history);
        let mut sent_on = None;
        let (status, value): (i64, i64) = match self.run_on(&call, &mut sent_on).await {
            Ok(answer) => answer,
            Err(e) => {
                self.undo_if_stalled(&e, sent_on, req.token_generated, || {
                    self.lock_undo(&keys, req)
                });
                return Err(e);
            }
        };
        let fence = u64::try_from(value).unwrap_or(0);
        let lease = || {
            Lease::left(fence, req.ttl, sent, sent_wall)
                .or_else(|| (!self.standalone).then(|| Lease::spent(fence, req.ttl, sent_wall)))
        };
        if status == 1 || status == 2 {
            // A new grant short of acks is undone; a renewal stands.
            let undo = (status == 1).then(|| self.lock_undo(&keys, req));
            self.check_replicas(sent_on.clone(), &keys.lock, undo, LaggingWrite::Lease)
                .await?;
        }
        match status {
            1 => match lease() {
                Some(lease) => Ok(Acquired::Granted(lease)),
                None => {
                    // Redis answered after the lease it set had run out:
                    // nothing is left to hand over.
                    let _ = self
                        .run::<(i64, String)>(&self.release_call(&keys, &req.token))
                        .await;
                    Err(LockError::LeaseSpent {
                        ttl: req.ttl.as_duration(),
                    })
                }
            },
            2 => lease().map(Acquired::Renewed).ok_or(LockError::LeaseSpent {
                ttl: req.ttl.as_duration(),
            }),
            3 => Err(LockError::ModeMismatch {
                held: req.mode.other(),
            }),
            // -1: a key a foreign client set without a TTL, with no expiry
            // to wait for. -2: a renew-only request found the lock free
            // (nothing to renew; the caller reads no lease from it), 1 ms
            // as memory's.
            _ => Err(LockError::Held {
                left: lease_left(value),
            }),
        }
    }

    async fn extend(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Lease, LockError> {
        let keys = Keys::new(&self.prefix, name);
        let (sent, sent_wall) = (Instant::now(), SystemTime::now());
        let (given, fallback) = match ttl {
            ExtendTtl::To(ttl) => (ttl.as_millis().to_string(), ttl),
            ExtendTtl::Own { fallback } => (String::new(), fallback),
        };
        let mut call = EXTEND.prepare_invoke();
        call.key(&keys.lock)
            .key(&keys.meta)
            .key(&keys.fence)
            .key(&keys.shared)
            .key(&keys.readers)
            .arg(token.expose())
            .arg(given)
            .arg(&keys.released)
            .arg(fallback.as_millis())
            .arg(self.fence_retention_ms)
            .arg(self.events.publish())
            .arg(unix_millis(sent_wall));
        self.with_history(&mut call, &keys.history);
        let mut sent_on = None;
        let (status, fence, ttl_ms): (i64, i64, i64) = self.run_on(&call, &mut sent_on).await?;
        match status {
            1 => {
                self.check_replicas(sent_on, &keys.lock, None, LaggingWrite::Lease)
                    .await?;
                let set_to = u64::try_from(ttl_ms)
                    .ok()
                    .and_then(|ms| Ttl::from_millis(ms, Ttl::CEILING_MS, "ttl_ms").ok())
                    .unwrap_or(fallback);
                let fence = u64::try_from(fence).unwrap_or(0);
                // An answer that came after the new lease had run out (by
                // the count from the send): the lease is gone, as Redlock
                // answers too.
                Lease::left(fence, set_to, sent, sent_wall)
                    .or_else(|| (!self.standalone).then(|| Lease::spent(fence, set_to, sent_wall)))
                    .ok_or(LockError::NotHeld)
            }
            0 => Err(LockError::NotHeld),
            _ => Err(LockError::NotOwner),
        }
    }

    async fn release(&self, name: &LockName, token: &Token) -> Result<Released, LockError> {
        let keys = Keys::new(&self.prefix, name);
        let mut sent_on = None;
        let (verdict, granted_at): (i64, String) = self
            .run_on(&self.release_call(&keys, token), &mut sent_on)
            .await?;
        match verdict {
            1 | 2 => {
                // A release the replicas did not hear of could come back
                // with a failover: the caller is told to release again.
                self.check_replicas(sent_on, &keys.lock, None, LaggingWrite::Release)
                    .await?;
                Ok(Released {
                    granted_at: parse_unix_millis(&granted_at),
                    mode: if verdict == 2 {
                        Mode::Shared
                    } else {
                        Mode::Exclusive
                    },
                })
            }
            0 => Err(LockError::NotHeld),
            _ => Err(LockError::NotOwner),
        }
    }

    /// One script (`handoff.lua`): the release, and the grant to `next`
    /// when it freed the lock and no other instance listens to its
    /// changes. With acknowledging replicas required (`min_replicas_acked`)
    /// a grant waits for its acks, so a release is only a release then.
    async fn release_handing(
        &self,
        name: &LockName,
        token: &Token,
        next: &AcquireRequest,
    ) -> Result<(Released, Option<Result<Acquired, LockError>>), LockError> {
        if self.min_replicas_acked > 0 || next.mode != Mode::Exclusive {
            return Ok((self.release(name, token).await?, None));
        }
        let keys = Keys::new(&self.prefix, name);
        let (sent, sent_wall) = (Instant::now(), SystemTime::now());
        let mut call = self.acquire_call(&HANDOFF, &keys, next, sent, sent_wall);
        call.arg(token.expose());
        self.with_history(&mut call, &keys.history);
        let mut sent_on = None;
        let (verdict, granted_at, status, value): (i64, String, String, String) =
            match self.run_on(&call, &mut sent_on).await {
                Ok(answer) => answer,
                Err(e) => {
                    // A script held up in a stalled Redis may still grant.
                    self.undo_if_stalled(&e, sent_on, next.token_generated, || {
                        self.lock_undo(&keys, next)
                    });
                    return Err(e);
                }
            };
        let released = match verdict {
            1 | 2 => Released {
                granted_at: parse_unix_millis(&granted_at),
                mode: if verdict == 2 {
                    Mode::Shared
                } else {
                    Mode::Exclusive
                },
            },
            0 => return Err(LockError::NotHeld),
            _ => return Err(LockError::NotOwner),
        };
        let tried = match status.as_str() {
            "1" => {
                let fence = value.parse().unwrap_or(0);
                match Lease::left(fence, next.ttl, sent, sent_wall) {
                    Some(lease) => Some(Ok(Acquired::Granted(lease))),
                    None => {
                        // Redis answered after the lease it set had run
                        // out: it goes, and the waiter tries for itself.
                        let _ = self
                            .run::<(i64, String)>(&self.release_call(&keys, &next.token))
                            .await;
                        None
                    }
                }
            }
            "err" => Some(Err(LockError::Backend(value))),
            // Not tried, or not granted: the waiter tries for itself.
            _ => None,
        };
        Ok((released, tried))
    }

    async fn holder(&self, name: &LockName) -> Result<Option<(Token, LockInfo)>, LockError> {
        let read_at = Instant::now();
        let answer = self.run(&self.inspect_call(name)).await?;
        Ok(holder_of(answer, read_at))
    }

    async fn probe(&self, name: &LockName, marker: &str) -> Result<ProbedLock, LockError> {
        let keys = Keys::new(&self.prefix, name);
        let mut call = PROBE.prepare_invoke();
        call.key(&keys.lock)
            .key(&keys.meta)
            .key(&keys.fence)
            .key(&keys.shared)
            .key(&keys.readers)
            .key(&keys.writers)
            .arg(&keys.released)
            .arg(self.events.publish())
            .arg(marker);
        let read_at = Instant::now();
        let (answer, counter) = inspect_and::<String>(self.run(&call).await?);
        Ok(ProbedLock {
            holder: holder_of(answer, read_at).map(|(_, info)| info),
            counter: counter.parse().ok(),
        })
    }

    async fn raise_fence(
        &self,
        name: &LockName,
        token: &Token,
        fence: u64,
    ) -> Result<bool, LockError> {
        let keys = Keys::new(&self.prefix, name);
        let mut call = RAISE_FENCE.prepare_invoke();
        call.key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.meta)
            .arg(token.expose())
            .arg(fence)
            .arg(self.fence_retention_ms);
        Ok(self.run::<i64>(&call).await? == 1)
    }

    async fn holders(
        &self,
        names: &[LockName],
    ) -> Result<Vec<Option<(Token, LockInfo)>>, LockError> {
        let read_at = Instant::now();
        let calls: Vec<_> = names.iter().map(|n| self.inspect_call(n)).collect();
        let answers = self.run_each::<InspectAnswer>(&calls).await?;
        Ok(names
            .iter()
            .zip(answers)
            .map(|(name, answer)| {
                listing::unless_foreign(Kind::Lock, name, answer)
                    .and_then(|answer| holder_of(answer, read_at))
            })
            .collect())
    }
}

#[async_trait]
impl SemaphoreNode for RedisBackend {
    async fn probe_semaphore(
        &self,
        name: &LockName,
        marker: &str,
    ) -> Result<crate::lock::semaphore::ProbedSemaphore, LockError> {
        RedisBackend::probe_semaphore(self, name, marker).await
    }

    async fn take_permit(
        &self,
        req: &PermitRequest,
    ) -> Result<Result<PermitOutcome, Refusal>, LockError> {
        RedisBackend::take_permit(self, req).await
    }

    async fn give_back_permit(
        &self,
        name: &LockName,
        token: &Token,
    ) -> Result<Option<Released>, LockError> {
        RedisBackend::give_back_permit(self, name, token).await
    }

    async fn extend_permit(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Option<Permit>, LockError> {
        RedisBackend::extend_permit(self, name, token, ttl).await
    }

    async fn inspect_semaphore(&self, name: &LockName) -> Result<Option<SemaphoreInfo>, LockError> {
        RedisBackend::inspect_semaphore(self, name).await
    }

    async fn semaphores(
        &self,
        names: &[LockName],
    ) -> Result<Vec<Option<SemaphoreInfo>>, LockError> {
        RedisBackend::semaphores(self, names).await
    }
}

#[async_trait]
impl RunNode for RedisBackend {
    async fn start_run(
        &self,
        req: &StartRequest,
    ) -> Result<Result<Started, StartRefusal>, LockError> {
        RedisBackend::start_run(self, req).await
    }

    async fn complete_run(
        &self,
        key: &LockName,
        token: &Token,
        result: &RunResult,
        retention: Duration,
    ) -> Result<Result<Completed, RunMiss>, LockError> {
        RedisBackend::complete_run(self, key, token, result, retention).await
    }

    async fn abandon_run(
        &self,
        key: &LockName,
        token: &Token,
        retention: Duration,
    ) -> Result<Result<(), RunMiss>, LockError> {
        RedisBackend::abandon_run(self, key, token, retention).await
    }

    async fn extend_run(
        &self,
        key: &LockName,
        token: &Token,
        ttl: ExtendTtl,
        retention: Duration,
    ) -> Result<Result<RunAttempt, RunMiss>, LockError> {
        RedisBackend::extend_run(self, key, token, ttl, retention).await
    }

    async fn inspect_run(&self, key: &LockName) -> Result<Option<RunInfo>, LockError> {
        RedisBackend::inspect_run(self, key).await
    }

    async fn probe_run(&self, key: &LockName, marker: &str) -> Result<ProbedRun, LockError> {
        RedisBackend::probe_run(self, key, marker).await
    }

    async fn runs(&self, keys: &[LockName]) -> Result<Vec<Option<RunInfo>>, LockError> {
        RedisBackend::runs(self, keys).await
    }
}

/// How often the cluster's nodes are read (`CLUSTER NODES`) in cluster
/// mode.
const CLUSTER_CHECK: Duration = Duration::from_secs(2);

/// Reads the cluster's nodes every [`CLUSTER_CHECK`] through a pooled
/// connection, for ever: the masters for the metrics (and the generation
/// that retires connections after a change), and the nodes to connect
/// through when no seed answers. Each reading asks a random node; one that
/// does not answer within a third of `timeout` (a frozen node) is left for
/// another, up to three tries.
async fn follow_cluster(pool: Pool, view: KnownNodes, timeout: Duration) {
    let mut every = tokio::time::interval(CLUSTER_CHECK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let mut read = false;
        for _ in 0..3 {
            let once = async {
                let mut conn = pool.get().await.ok()?;
                match &mut *conn {
                    Conn::Cluster(cluster, _) => cluster_nodes(cluster).await.ok(),
                    _ => None,
                }
            };
            if let Ok(Some(listing)) = tokio::time::timeout(timeout / 3, once).await {
                view.observe(&listing);
                read = true;
                break;
            }
        }
        if !read {
            tracing::debug!("could not read the cluster's nodes");
        }
    }
}

/// What `inspect.lua` answers: `{pttl, token, fence, owner, granted_at_ms,
/// writer_waits, shared, meta}`.
type InspectAnswer = (
    i64,
    String,
    String,
    String,
    String,
    i64,
    Vec<String>,
    String,
);

/// An `inspect.lua` answer with one more value after it (a probe's fence
/// counter, a history read's list), as Redis gives it.
type InspectAnd<T> = (
    i64,
    String,
    String,
    String,
    String,
    i64,
    Vec<String>,
    String,
    T,
);

/// An [`InspectAnd`] answer split into the inspect's part and the value
/// after it.
fn inspect_and<T>(answer: InspectAnd<T>) -> (InspectAnswer, T) {
    let (pttl, token, fence, owner, granted_at, writer, shared, meta, more) = answer;
    (
        (pttl, token, fence, owner, granted_at, writer, shared, meta),
        more,
    )
}

/// The holder an `inspect.lua` answer tells of, read from a request sent at
/// `read_at`; `None` when the lock is free. A shared lock has no token
/// (`Token` is then empty: never one of a holder).
fn holder_of(answer: InspectAnswer, read_at: Instant) -> Option<(Token, LockInfo)> {
    let (pttl, token, fence, owner, granted_at, writer, shared, meta) = answer;
    let writer_waiting = writer == 1;
    if pttl == -3 {
        let leases = shared
            .chunks_exact(2)
            .filter_map(|pair| shared_lease(&pair[0], &pair[1], read_at))
            .collect();
        return LockInfo::shared(leases, writer_waiting)
            .map(|info| (Token::from_stored(String::new()), info));
    }
    if pttl == -2 {
        return None;
    }
    // A foreign client may have stored any value: kept as it is, so that
    // Redlock can still find the holder a majority of nodes agrees on.
    let token = Token::from_stored(token);
    // The PTTL was read somewhere during the round trip; count the time
    // since the request was sent against it, so the answer errs early.
    let remaining = u64::try_from(pttl)
        .ok()
        .map(|ms| Duration::from_millis(ms).saturating_sub(read_at.elapsed()));
    let mut info = LockInfo::exclusive(
        fence.parse().ok(),
        remaining,
        Some(owner).filter(|o| !o.is_empty()),
        Meta::from_stored(&meta),
        parse_unix_millis(&granted_at),
    );
    info.writer_waiting = writer_waiting;
    Some((token, info))
}

/// One shared lease of an `inspect.lua` answer: what is left of it (in
/// ms, as text) and its JSON record; `None` for a record lockd did not
/// write.
fn shared_lease(left_ms: &str, record: &str, read_at: Instant) -> Option<PermitInfo> {
    let left = Duration::from_millis(left_ms.parse().ok()?).saturating_sub(read_at.elapsed());
    let record: serde_json::Value = serde_json::from_str(record).ok()?;
    let fence = match &record["fence"] {
        serde_json::Value::String(text) => text.parse().ok()?,
        other => other.as_u64()?,
    };
    Some(PermitInfo {
        fence,
        owner: record["owner"]
            .as_str()
            .filter(|o| !o.is_empty())
            .map(str::to_owned),
        meta: record["meta"].as_str().and_then(Meta::from_stored),
        remaining: left,
        granted_at: record["granted_at_ms"]
            .as_u64()
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
    })
}

/// A wall-clock time stored as Unix milliseconds; `None` when empty or
/// not a number (a foreign client's key).
fn parse_unix_millis(stored: &str) -> Option<SystemTime> {
    stored
        .parse::<u64>()
        .ok()
        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each exclusive lease's script has the shared-lease rules once, in
    /// place of its marker, after the path that needs none of them.
    #[test]
    fn the_shared_rules_take_the_place_of_the_marker() {
        for body in [
            include_str!("scripts/acquire.lua"),
            include_str!("scripts/release.lua"),
            include_str!("scripts/extend.lua"),
        ] {
            assert_eq!(body.matches(SHARED_RULES_AT).count(), 1);
            let lua = exclusive_source(true, body);
            assert!(!lua.contains(SHARED_RULES_AT));
            assert_eq!(lua.matches("local function live_shared(").count(), 1);
            assert_eq!(lua.matches("local function tell(").count(), 1);
            let fast = &lua[..lua.find("local function tell(").expect("the rules")];
            assert!(!fast.contains("live_shared("), "{fast}");
        }
    }

    #[test]
    fn keys_use_the_name_as_a_hash_tag() {
        let name = LockName::parse("orders:1").expect("valid");
        let keys = Keys::new("lockd:", &name);
        assert_eq!(keys.lock, "lockd:{orders:1}");
        assert_eq!(keys.fence, "lockd:{orders:1}:fence");
        assert_eq!(keys.meta, "lockd:{orders:1}:meta");
        assert_eq!(keys.shared, "lockd:{orders:1}:shared");
        assert_eq!(keys.readers, "lockd:{orders:1}:readers");
        assert_eq!(keys.writers, "lockd:{orders:1}:writers");
        assert_eq!(keys.history, "lockd:{orders:1}:history");
        assert_eq!(keys.released, "lockd:{orders:1}:released");
        assert_eq!(joined(&[]), "");
        assert_eq!(joined(&["a", "", "{é}"]), "a{é}");
    }
}
