//! The Redis connection pool: deadpool's managed pool over multiplexed
//! connections (to one server, or a Redis Cluster connection that routes
//! each command to the master of its key's slot), with a manager that does
//! not talk to Redis when it hands a connection out.
//!
//! deadpool-redis's manager sends `UNWATCH` + `PING` each time the pool
//! hands out a connection: one more round trip for every lock operation,
//! measured at half of all commands lockd sent to Redis. Here a connection
//! is handed out as it is; one that broke (Redis restarted) is found by the
//! operation itself, which throws it away together with every idle
//! connection and tries once more on a fresh one (see
//! [`super::redis::RedisBackend`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleResult};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisError, RedisFuture, Value};

use super::LockError;
use super::connect::{self, PushHandler, RedisTls};
use super::restart::RestartWatch;
use super::sentinel::Sentinels;

/// What a [`Connector`] connects to.
pub enum Target {
    /// One Redis server (boxed: a client with TLS settings is large).
    Server(Box<Client>),
    /// A Redis Cluster, found from its seed nodes. The connection follows
    /// `MOVED` and `ASK`, and refreshes its slot map when the cluster
    /// changes.
    Cluster(Box<ClusterTarget>),
    /// The master of a Sentinel set, as the Sentinels name it now.
    Sentinel(Arc<Sentinels>),
}

/// The nodes (`host:port`) a cluster connection saw last, shared by every
/// connection to one cluster (the pool's and the release-event one's).
pub type KnownNodes = Arc<Mutex<Vec<String>>>;

/// A Redis Cluster: the client over its seeds, and the nodes seen since,
/// to connect through when every seed is down.
pub struct ClusterTarget {
    /// The client over the seeds.
    seeds: ClusterClient,
    /// The first seed's URL: the scheme and credentials of a client over
    /// other nodes.
    template: String,
    tls: RedisTls,
    timeout: Duration,
    push: Option<PushHandler>,
    /// Every node the last connection saw.
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
        Ok(Self {
            seeds: connect::cluster_client(&seeds, &tls, timeout, push.as_ref())?,
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
    pub async fn connect(&self) -> Result<ClusterConnection, RedisError> {
        let mut conn = match self.seeds.get_async_connection().await {
            Ok(conn) => conn,
            Err(e) => {
                let known = self.known.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let Some(client) = (!known.is_empty()).then(|| self.over(&known)).flatten() else {
                    return Err(e);
                };
                client.get_async_connection().await?
            }
        };
        let nodes = conn
            .route_command(
                redis::cmd("CLUSTER").arg("NODES").clone(),
                redis::cluster_routing::RoutingInfo::SingleNode(
                    redis::cluster_routing::SingleNodeRoutingInfo::Random,
                ),
            )
            .await
            .and_then(|v| redis::from_redis_value::<String>(v).map_err(Into::into));
        if let Ok(text) = nodes {
            let seen: Vec<String> = text
                .lines()
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    let flags = fields.get(2)?;
                    if flags.contains("fail") || flags.contains("noaddr") {
                        return None;
                    }
                    Some(fields.get(1)?.split('@').next()?.to_owned())
                })
                .collect();
            if !seen.is_empty() {
                *self.known.lock().unwrap_or_else(|p| p.into_inner()) = seen;
            }
        }
        Ok(conn)
    }
}

/// One connection: to a server, or to a whole cluster. Either is
/// multiplexed, so cloning it shares it.
#[derive(Clone)]
pub enum Conn {
    /// A connection to one server.
    Server(MultiplexedConnection),
    /// Connections to every node of a cluster, routing by key slot.
    Cluster(ClusterConnection),
    /// A connection to the master of a Sentinel set, with the generation
    /// of the master it was opened to (see [`Sentinels`]).
    Master(MultiplexedConnection, u64),
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
            Self::Cluster(conn) => conn.req_packed_command(cmd),
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
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(conn) | Self::Master(conn, _) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

/// Opens connections to one Redis server or one cluster.
pub struct Connector {
    target: Target,
    config: AsyncConnectionConfig,
    /// Told the server's `run_id` and uptime at every new connection, when
    /// restarts are watched (Redlock's delayed restart).
    restarts: Option<Arc<RestartWatch>>,
}

impl Connector {
    /// A connector for `target`, with `config`'s connect and response
    /// timeouts (a cluster client carries its own). With `restarts`, every
    /// new connection to a server first reads `INFO server` and tells the
    /// watch what it found.
    pub fn new(
        target: Target,
        config: AsyncConnectionConfig,
        restarts: Option<Arc<RestartWatch>>,
    ) -> Self {
        Self {
            target,
            config,
            restarts,
        }
    }
}

impl managed::Manager for Connector {
    type Type = Conn;
    type Error = RedisError;

    async fn create(&self) -> Result<Conn, RedisError> {
        let client = match &self.target {
            Target::Server(client) => client,
            Target::Cluster(cluster) => return Ok(Conn::Cluster(cluster.connect().await?)),
            Target::Sentinel(sentinels) => {
                let (client, generation) = sentinels.master().await?;
                let conn = client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await
                    .inspect_err(|_| sentinels.forget(generation, "cannot connect"))?;
                return Ok(Conn::Master(conn, generation));
            }
        };
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        if let Some(restarts) = &self.restarts {
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await?;
            restarts.observe(&info);
        }
        Ok(Conn::Server(conn))
    }

    async fn recycle(&self, conn: &mut Conn, _metrics: &Metrics) -> RecycleResult<RedisError> {
        // A connection to a master that is no longer the master is dropped.
        match (conn, &self.target) {
            (Conn::Master(_, generation), Target::Sentinel(sentinels))
                if *generation != sentinels.generation() =>
            {
                Err(managed::RecycleError::message("the Redis master changed"))
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
