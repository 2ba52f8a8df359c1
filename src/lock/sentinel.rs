//! Following the master of a Redis Sentinel set ([`Sentinels`]).
//!
//! lockd asks the Sentinels for the address of the master named by
//! `--sentinel-master` (`SENTINEL get-master-addr-by-name`, through the
//! redis crate's `Sentinel`, which also checks that the node it finds calls
//! itself master), keeps it, and connects there. The master it keeps is
//! dropped, and asked for again at the next connection, when:
//!
//! - a Sentinel announces `+switch-master` for that name (one subscription
//!   per Sentinel, see [`Sentinels::follow`]): within a moment of the
//!   failover, while the old master may still accept writes for seconds
//!   until Sentinel demotes it;
//! - a command fails with `READONLY` (the node was demoted) or its
//!   connection drops.
//!
//! Each change of master bumps a generation. A pooled connection carries the
//! generation it was opened in; the pool drops a connection of an older one
//! instead of handing it out, and an answer that arrives on one after the
//! change is not trusted (the write may have reached a node that is no
//! longer the master): the operation fails as unavailable, and the caller
//! retries on the new master.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt as _;
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{Client, IntoConnectionInfo, RedisError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::ExponentialBackoff;

/// The pauses between reconnections to a Sentinel that was lost.
const FOLLOW_BACKOFF: ExponentialBackoff =
    ExponentialBackoff::new(Duration::from_millis(100), Duration::from_secs(2));

/// The master of one Sentinel set, as lockd knows it now.
pub struct Sentinels {
    /// The name Sentinel monitors the master by (`--sentinel-master`).
    name: String,
    /// Asks the Sentinels; `&mut` in the redis crate, so behind a lock.
    sentinel: tokio::sync::Mutex<Sentinel>,
    /// One client per Sentinel, for the `+switch-master` subscriptions.
    sentinel_clients: Vec<Client>,
    /// How the master is connected to (credentials and database of the
    /// Sentinel URLs).
    node_info: SentinelNodeConnectionInfo,
    /// The longest a question to the Sentinels may take.
    timeout: Duration,
    /// The master now, with the generation it was found in.
    current: Mutex<Option<Master>>,
    /// Bumped at every change of master (or loss of it).
    generation: AtomicU64,
    /// Master changes seen (`+switch-master`, `READONLY`, a new address).
    failovers: AtomicU64,
    /// Tells the release-event subscriber to move to the new master.
    changes: watch::Sender<u64>,
}

/// One master: its address and a client for it.
#[derive(Clone)]
struct Master {
    addr: String,
    client: Client,
    generation: u64,
}

impl Sentinels {
    /// The Sentinels at `urls`, watching the master named `name`. The
    /// username, password and database of the first URL are used for the
    /// master too.
    ///
    /// # Errors
    /// When a URL cannot be parsed.
    pub fn new(urls: &[String], name: &str, timeout: Duration) -> Result<Self, RedisError> {
        let infos = urls
            .iter()
            .map(|u| u.as_str().into_connection_info())
            .collect::<Result<Vec<_>, _>>()?;
        let node_info = infos
            .first()
            .map_or_else(SentinelNodeConnectionInfo::default, |i| {
                SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(i.redis_settings().clone())
            });
        let sentinel_clients = infos
            .iter()
            .cloned()
            .map(Client::open)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            name: name.to_owned(),
            sentinel: tokio::sync::Mutex::new(Sentinel::build(infos)?),
            sentinel_clients,
            node_info,
            timeout,
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
            failovers: AtomicU64::new(0),
            changes: watch::channel(0).0,
        })
    }

    /// A client for the master, with the generation it belongs to: the one
    /// kept, or the one the Sentinels name now.
    ///
    /// # Errors
    /// When no Sentinel answers in time, or none knows a master by that
    /// name that calls itself master.
    pub async fn master(&self) -> Result<(Client, u64), RedisError> {
        if let Some(m) = self.kept() {
            return Ok((m.client, m.generation));
        }
        let seen = self.generation();
        let ask = async {
            let mut sentinel = self.sentinel.lock().await;
            sentinel
                .async_master_for(&self.name, Some(&self.node_info))
                .await
        };
        let client = tokio::time::timeout(self.timeout, ask)
            .await
            .map_err(|_| {
                RedisError::from((redis::ErrorKind::Io, "no Sentinel named the master in time"))
            })??;
        let addr = client.get_connection_info().addr().to_string();
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = current.as_ref() {
            // Another task found it first.
            return Ok((m.client.clone(), m.generation));
        }
        let generation = self.generation();
        if generation != seen {
            // The master changed while the Sentinels were asked: their
            // answer may be the old one.
            return Err(RedisError::from((
                redis::ErrorKind::Io,
                "the master changed while the Sentinels were asked",
            )));
        }
        tracing::info!(master = %addr, name = %self.name, "the Redis master, from Sentinel");
        *current = Some(Master {
            addr,
            client: client.clone(),
            generation,
        });
        Ok((client, generation))
    }

    fn kept(&self) -> Option<Master> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The generation now: it changes whenever the master does.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The master's `host:port` now, if one is known.
    pub fn master_addr(&self) -> Option<String> {
        self.kept().map(|m| m.addr)
    }

    /// How many master changes lockd has seen.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::SeqCst)
    }

    /// A receiver told of every change of master.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Forgets the master of generation `seen` (it answered `READONLY`, or
    /// a Sentinel announced a new one), so that the next connection asks
    /// the Sentinels again. Does nothing if the master changed since.
    pub fn forget(&self, seen: u64, why: &str) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if self
            .generation
            .compare_exchange(seen, seen + 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return;
        }
        let old = current.take().map(|m| m.addr);
        self.failovers.fetch_add(1, Ordering::SeqCst);
        tracing::warn!(old = ?old, name = %self.name, reason = why, "the Redis master changed; asking the Sentinels again");
        self.changes.send_replace(seen + 1);
    }

    /// Listens for `+switch-master` on every Sentinel until `stop`, and
    /// forgets the master at each one for this name.
    pub async fn follow(&self, stop: CancellationToken) {
        let each = self
            .sentinel_clients
            .iter()
            .map(|client| self.follow_one(client));
        tokio::select! {
            _ = futures_util::future::join_all(each) => {}
            () = stop.cancelled() => {}
        }
    }

    async fn follow_one(&self, client: &Client) {
        let mut backoff = FOLLOW_BACKOFF.pauses();
        loop {
            let subscribed = async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe("+switch-master").await?;
                Ok::<_, RedisError>(pubsub.into_on_message())
            };
            match tokio::time::timeout(self.timeout, subscribed).await {
                Ok(Ok(mut stream)) => {
                    backoff.reset();
                    while let Some(msg) = stream.next().await {
                        // "<name> <old ip> <old port> <new ip> <new port>"
                        let payload: String = msg.get_payload().unwrap_or_default();
                        if payload.split_whitespace().next() == Some(self.name.as_str()) {
                            self.forget(self.generation(), "+switch-master");
                        }
                    }
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "cannot subscribe to a Sentinel"),
                Err(_) => tracing::debug!("subscribing to a Sentinel timed out"),
            }
            backoff.wait().await;
        }
    }
}
