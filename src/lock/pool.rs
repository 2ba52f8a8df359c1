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

use deadpool::managed::{self, Metrics, RecycleResult};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError};

/// Opens connections to one Redis server.
pub struct Connector {
    client: Client,
    config: AsyncConnectionConfig,
}

impl Connector {
    /// A connector for `client`, with `config`'s connect and response
    /// timeouts.
    pub fn new(client: Client, config: AsyncConnectionConfig) -> Self {
        Self { client, config }
    }
}

impl managed::Manager for Connector {
    type Type = MultiplexedConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<MultiplexedConnection, RedisError> {
        self.client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
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
