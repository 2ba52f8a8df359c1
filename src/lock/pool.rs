//! The Redis connection pool: deadpool's managed pool over multiplexed
//! connections, with a manager that does not talk to Redis when it hands a
//! connection out.
//!
//! deadpool-redis's manager sends `UNWATCH` + `PING` each time the pool
//! hands out a connection: one more round trip for every lock operation,
//! measured at half of all commands lockd sent to Redis. Here a connection
//! is handed out as it is; one that broke (Redis restarted) is found by the
//! operation itself, which throws it away together with every idle
//! connection and tries once more on a fresh one (see
//! [`super::redis::RedisBackend`]).

use std::sync::Arc;

use deadpool::managed::{self, Metrics, RecycleResult};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError};

use super::restart::RestartWatch;

/// Opens connections to one Redis server.
pub struct Connector {
    client: Client,
    config: AsyncConnectionConfig,
    /// Told the server's `run_id` and uptime at every new connection, when
    /// restarts are watched (Redlock's delayed restart).
    restarts: Option<Arc<RestartWatch>>,
}

impl Connector {
    /// A connector for `client`, with `config`'s connect and response
    /// timeouts. With `restarts`, every new connection first reads
    /// `INFO server` and tells the watch what it found.
    pub fn new(
        client: Client,
        config: AsyncConnectionConfig,
        restarts: Option<Arc<RestartWatch>>,
    ) -> Self {
        Self {
            client,
            config,
            restarts,
        }
    }
}

impl managed::Manager for Connector {
    type Type = MultiplexedConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<MultiplexedConnection, RedisError> {
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        if let Some(restarts) = &self.restarts {
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await?;
            restarts.observe(&info);
        }
        Ok(conn)
    }

    async fn recycle(
        &self,
        _conn: &mut MultiplexedConnection,
        _metrics: &Metrics,
    ) -> RecycleResult<RedisError> {
        Ok(())
    }
}

/// The pool.
pub type Pool = managed::Pool<Connector>;

/// A pooled connection.
pub type Connection = managed::Object<Connector>;

/// Why no connection could be had.
pub type PoolError = managed::PoolError<RedisError>;
