//! Following the master of a Redis Sentinel set ([`Sentinels`]).
//!
//! lockd asks every Sentinel for the master named by `--sentinel-master`
//! (`SENTINEL master NAME`), takes the answer of the highest
//! `config-epoch` (a Sentinel that has not heard of the last failover yet
//! still names the old master, which calls itself master until it is
//! demoted: the epoch tells the answers apart) from the Sentinels not in the
//! middle of a failover (the leader names the old master at the new epoch
//! until it switches), checks that the node calls itself master (`ROLE`),
//! keeps it, and connects there.
//!
//! - When a Sentinel announces `+switch-master` for that name (one
//!   subscription per Sentinel, see [`Sentinels::follow`]), lockd moves to
//!   the new master the message names, at once: the old master may still
//!   accept writes for seconds until Sentinel demotes it.
//! - When a Sentinel announces that it is failing the master over
//!   (`+failover-state-*`, `+selected-slave`, `+promoted-slave`), before
//!   `+switch-master`, lockd stops writing to the master at once: it
//!   forgets it, and every operation is unavailable (503 with
//!   `Retry-After`) until the switch, the failover's abort
//!   (`-failover-abort-*`), or [`HOLD_MAX`]. A write the old master took
//!   after its replica was promoted would be lost with it (a release
//!   answered 204 that comes back).
//! - When a command fails with `READONLY` (the node was demoted) or its
//!   connection drops, lockd forgets the master and asks again.
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
use redis::RedisError;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::connect::{self, Client, RedisTls};
use crate::backoff::ExponentialBackoff;
use crate::lock::LockError;

/// How often the Sentinels are asked which master is current.
const TOPOLOGY_CHECK: Duration = Duration::from_secs(1);

/// The longest lockd holds off writing after a Sentinel announced a
/// failover that neither switched nor aborted since (an announcement lost
/// with its Sentinel's connection): then it asks the Sentinels again.
pub const HOLD_MAX: Duration = Duration::from_secs(15);

/// The pauses between reconnections to a Sentinel that was lost.
const FOLLOW_BACKOFF: ExponentialBackoff =
    ExponentialBackoff::new(Duration::from_millis(100), Duration::from_secs(2));

/// The master of one Sentinel set, as lockd knows it now.
pub struct Sentinels {
    /// The name Sentinel monitors the master by (`--sentinel-master`).
    name: String,
    /// One client per Sentinel, to ask them and for the `+switch-master`
    /// subscriptions.
    sentinel_clients: Vec<Client>,
    /// How the master is connected to: the first Sentinel URL's scheme,
    /// credentials and database, with the master's address.
    template: String,
    /// The CA and client certificates for `rediss://`.
    tls: RedisTls,
    /// The longest a question to the Sentinels may take.
    timeout: Duration,
    /// The master now, with the generation it was found in.
    current: Mutex<Option<Master>>,
    /// The address of the last master lockd used, to count changes.
    last_addr: Mutex<Option<String>>,
    /// Bumped at every change of master (or loss of it).
    generation: AtomicU64,
    /// Master changes seen (`+switch-master`, `READONLY`, a new address).
    failovers: AtomicU64,
    /// Tells the release-event subscriber to move to the new master.
    changes: watch::Sender<u64>,
    /// Set while a failover the Sentinels announced has not switched or
    /// aborted: until when lockd holds off writing.
    held: Mutex<Option<tokio::time::Instant>>,
}

/// One Sentinel's answer to `SENTINEL master NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Named {
    /// The master's address as this Sentinel knows it.
    host: String,
    port: u16,
    /// Its `config-epoch`: bumped by each failover.
    epoch: u64,
    /// `failover_in_progress` is among its flags: this Sentinel leads a
    /// failover that has not switched yet. It then gives the failover's
    /// new epoch beside the old master's address while the other Sentinels
    /// already name the new master at that epoch: about a second after a
    /// crash, about 5 s after a `SENTINEL FAILOVER` (see docs/redis.md).
    in_failover: bool,
}

/// The master to use, of the Sentinels' answers: the address of the
/// highest `config-epoch`, among the answers of Sentinels that are not in
/// the middle of a failover (all of them, when every one is). When answers
/// of that epoch name different addresses, the one `is_kept` says is in use
/// wins, else the one most Sentinels name (the first, on a tie). `None`
/// when there is no answer.
fn choose(answers: &[Named], is_kept: impl Fn(&str, u16) -> bool) -> Option<(String, u16)> {
    let settled: Vec<&Named> = answers.iter().filter(|a| !a.in_failover).collect();
    let pool: Vec<&Named> = if settled.is_empty() {
        answers.iter().collect()
    } else {
        settled
    };
    let top = pool.iter().map(|a| a.epoch).max()?;
    let best: Vec<&&Named> = pool.iter().filter(|a| a.epoch == top).collect();
    if let Some(kept) = best.iter().find(|a| is_kept(&a.host, a.port)) {
        return Some((kept.host.clone(), kept.port));
    }
    let votes = |a: &Named| {
        best.iter()
            .filter(|b| b.host == a.host && b.port == a.port)
            .count()
    };
    let mut winner = *best.first()?;
    for a in &best {
        if votes(a) > votes(winner) {
            winner = a;
        }
    }
    Some((winner.host.clone(), winner.port))
}

/// A resolution failure: transient, as a server that does not answer.
fn unavailable(what: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::Io, what))
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
    /// scheme, username, password and database of the first URL are used
    /// for the master too; `rediss://` URLs connect over TLS with `tls`,
    /// to the Sentinels and to the master alike (see [`connect`]).
    ///
    /// # Errors
    /// When a URL cannot be used.
    pub fn new(
        urls: &[String],
        name: &str,
        timeout: Duration,
        tls: &RedisTls,
    ) -> Result<Self, LockError> {
        let template = urls
            .first()
            .cloned()
            .ok_or_else(|| LockError::Backend("no Sentinel URL".into()))?;
        let sentinel_clients = urls
            .iter()
            .map(|url| connect::client(url, tls))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            name: name.to_owned(),
            sentinel_clients,
            template,
            tls: tls.clone(),
            last_addr: Mutex::new(None),
            timeout,
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
            failovers: AtomicU64::new(0),
            changes: watch::channel(0).0,
            held: Mutex::new(None),
        })
    }

    /// A client for the master, with the generation it belongs to: the one
    /// kept, or the one the Sentinels name now.
    ///
    /// # Errors
    /// When no Sentinel answers in time, or none knows a master by that
    /// name that calls itself master.
    pub async fn master(&self) -> Result<(Client, u64), RedisError> {
        if self.holding() {
            return Err(unavailable(
                "the Sentinels are failing the master over; lockd writes again once the new master is named",
            ));
        }
        if let Some(m) = self.kept() {
            return Ok((m.client, m.generation));
        }
        let seen = self.generation();
        let ask = async {
            let (host, port) = self.ask(None).await?;
            let client = self.client_for(host, port)?;
            let mut conn = client.connect(self.timeout).await?;
            let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
            match role.first() {
                Some(redis::Value::BulkString(r)) if r.as_slice() == b"master" => Ok(client),
                _ => Err(unavailable(
                    "the node the Sentinels name is not a master (yet)",
                )),
            }
        };
        let client = tokio::time::timeout(self.timeout, ask)
            .await
            .map_err(|_| unavailable("no Sentinel named the master in time"))??;
        let addr = client.connection_info().addr().to_string();
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = current.as_ref() {
            // Another task found it first.
            return Ok((m.client.clone(), m.generation));
        }
        let generation = self.generation();
        if generation != seen {
            // The master changed while the Sentinels were asked: their
            // answer may be the old one.
            return Err(unavailable(
                "the master changed while the Sentinels were asked",
            ));
        }
        *current = Some(Master {
            addr: addr.clone(),
            client: client.clone(),
            generation,
        });
        drop(current);
        self.note_master(&addr);
        Ok((client, generation))
    }

    /// The master by every Sentinel that answers `SENTINEL master NAME` in
    /// time, as [`choose`] picks it of their answers; `kept` (`host:port`,
    /// the master in use) wins a tie.
    async fn ask(&self, kept: Option<&str>) -> Result<(String, u16), RedisError> {
        let each = self.sentinel_clients.iter().map(|client| async move {
            let node = client.connection_info().addr().to_string();
            let one = async {
                let mut conn = client.connect(self.timeout).await?;
                redis::cmd("SENTINEL")
                    .arg("master")
                    .arg(&self.name)
                    .query_async::<Vec<String>>(&mut conn)
                    .await
            };
            // One Sentinel that hangs must not hold up the others' answers.
            let fields = match tokio::time::timeout(self.timeout / 2, one).await {
                Ok(Ok(fields)) => fields,
                // It answered, and does not know the name.
                Ok(Err(e)) if e.code().is_some() => {
                    return Ok(None);
                }
                Ok(Err(e)) => return Err(format!("{node}: {e}")),
                Err(_) => return Err(format!("{node}: no answer in {:?}", self.timeout / 2)),
            };
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|kv| kv.first().map(String::as_str) == Some(name))
                    .and_then(|kv| kv.get(1).cloned())
            };
            let known = (|| {
                Some(Named {
                    host: field("ip")?,
                    port: field("port")?.parse().ok()?,
                    epoch: field("config-epoch")?.parse().unwrap_or(0),
                    in_failover: field("flags")
                        .is_some_and(|f| f.split(',').any(|f| f == "failover_in_progress")),
                })
            })();
            Ok(known)
        });
        let answers = futures_util::future::join_all(each).await;
        let unreachable: Vec<String> = answers.iter().filter_map(|a| a.clone().err()).collect();
        let named: Vec<Named> = answers
            .into_iter()
            .filter_map(Result::ok)
            .flatten()
            .collect();
        let is_kept = |host: &str, port: u16| {
            kept.is_some_and(|kept| {
                self.client_for(host.to_owned(), port)
                    .is_ok_and(|c| c.connection_info().addr().to_string() == kept)
            })
        };
        choose(&named, is_kept).ok_or_else(|| {
            if unreachable.len() == self.sentinel_clients.len() {
                RedisError::from((
                    redis::ErrorKind::Io,
                    "no Sentinel answered",
                    unreachable.join("; "),
                ))
            } else {
                unavailable("no Sentinel that answered knows the master")
            }
        })
    }

    /// A client for the master at `host:port`, with the first Sentinel
    /// URL's scheme, credentials and database, and the TLS settings.
    fn client_for(&self, host: String, port: u16) -> Result<Client, RedisError> {
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host
        };
        let url = connect::with_address(&self.template, &format!("{host}:{port}"))
            .ok_or_else(|| unavailable("the Sentinels named a master address lockd cannot use"))?;
        connect::client(&url, &self.tls).map_err(|e| {
            RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "cannot use the master the Sentinels named",
                e.to_string(),
            ))
        })
    }

    /// Counts a change of master when `addr` is not the last one used.
    fn note_master(&self, addr: &str) {
        let mut last = self
            .last_addr
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last.as_deref() != Some(addr) {
            if last.is_some() {
                self.failovers.fetch_add(1, Ordering::SeqCst);
            }
            tracing::info!(master = %addr, name = %self.name, "the Redis master, from Sentinel");
            *last = Some(addr.to_owned());
        }
    }

    /// Moves to the master at `host:port` at once; `why` says what named
    /// it (`+switch-master`, or the check every second).
    fn switch_to(&self, host: &str, port: u16, why: &str) {
        self.release_hold();
        let Ok(client) = self.client_for(host.to_owned(), port) else {
            self.forget(self.generation(), why);
            return;
        };
        let addr = client.connection_info().addr().to_string();
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_some_and(|m| m.addr == addr) {
            return;
        }
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let old = current.replace(Master {
            addr: addr.clone(),
            client,
            generation,
        });
        drop(current);
        tracing::warn!(old = ?old.map(|m| m.addr), new = %addr, name = %self.name, reason = why, "the Redis master changed");
        self.note_master(&addr);
        self.changes.send_replace(generation);
    }

    /// Whether a failover the Sentinels announced holds writes off now.
    fn holding(&self) -> bool {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        match *held {
            Some(until) if tokio::time::Instant::now() < until => true,
            Some(_) => {
                *held = None;
                tracing::warn!(name = %self.name, "a failover the Sentinels announced neither switched nor aborted in time; asking the Sentinels again");
                false
            }
            None => false,
        }
    }

    /// Stops writing to the master now: a Sentinel announced its failover
    /// (`why`, the event).
    fn hold(&self, why: &str) {
        let first = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(tokio::time::Instant::now() + HOLD_MAX)
            .is_none();
        if first {
            tracing::warn!(name = %self.name, event = why, "the Sentinels are failing the master over: no writes until the new master is named (503 meanwhile)");
        }
        self.forget(self.generation(), why);
    }

    /// Ends a hold (the switch came, or the failover aborted).
    fn release_hold(&self) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
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
        tracing::warn!(old = ?old, name = %self.name, reason = why, "lost the Redis master; asking the Sentinels again");
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
            () = self.check_every_second() => {}
            () = stop.cancelled() => {}
        }
    }

    /// Asks the Sentinels once a second which master is current (highest
    /// `config-epoch`), and moves there if it is not the one kept: a
    /// `+switch-master` can be missed (the subscription was being
    /// re-established) or come late (from a Sentinel that heard of the
    /// failover late). Only topology is asked, never a lock.
    async fn check_every_second(&self) {
        loop {
            tokio::time::sleep(TOPOLOGY_CHECK).await;
            let Some(kept) = self.kept() else { continue };
            let asked = tokio::time::timeout(self.timeout, self.ask(Some(&kept.addr))).await;
            if let Ok(Ok((host, port))) = asked
                && let Ok(client) = self.client_for(host.clone(), port)
                && client.connection_info().addr().to_string() != kept.addr
            {
                self.switch_to(&host, port, "the Sentinels name another master");
            }
        }
    }

    async fn follow_one(&self, client: &Client) {
        let mut backoff = FOLLOW_BACKOFF.pauses();
        loop {
            let subscribed = async {
                let mut pubsub = client.pubsub().await?;
                pubsub.subscribe("+switch-master").await?;
                pubsub
                    .subscribe(&["+selected-slave", "+promoted-slave"])
                    .await?;
                pubsub
                    .psubscribe(&["+failover-state-*", "-failover-abort-*"])
                    .await?;
                Ok::<_, RedisError>(pubsub.into_on_message())
            };
            match tokio::time::timeout(self.timeout, subscribed).await {
                Ok(Ok(mut stream)) => {
                    backoff.reset();
                    while let Some(msg) = stream.next().await {
                        let payload: String = msg.get_payload().unwrap_or_default();
                        let event = msg.get_channel_name();
                        if event != "+switch-master" {
                            if failover_of(&payload) == Some(self.name.as_str()) {
                                if event.starts_with("-failover-abort") {
                                    self.release_hold();
                                    self.forget(self.generation(), event);
                                } else {
                                    self.hold(event);
                                }
                            }
                            continue;
                        }
                        // "<name> <old ip> <old port> <new ip> <new port>"
                        let parts: Vec<&str> = payload.split_whitespace().collect();
                        if let [name, _, _, host, port] = parts.as_slice()
                            && *name == self.name
                        {
                            match port.parse() {
                                Ok(port) => self.switch_to(host, port, "+switch-master"),
                                Err(_) => self.forget(self.generation(), "+switch-master"),
                            }
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

/// The master name a Sentinel's failover event is about: `master NAME ip
/// port ...` (`+failover-state-*`, `-failover-abort-*`), or `slave ip:port
/// ip port @ NAME ip port` (`+selected-slave`, `+promoted-slave`).
fn failover_of(payload: &str) -> Option<&str> {
    let parts: Vec<&str> = payload.split_whitespace().collect();
    match parts.iter().position(|p| *p == "@") {
        Some(at) => parts.get(at + 1).copied(),
        None if parts.first() == Some(&"master") => parts.get(1).copied(),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{Named, choose, failover_of};

    #[test]
    fn a_failover_event_names_its_master() {
        assert_eq!(
            failover_of("master mymaster 127.0.0.1 6379"),
            Some("mymaster")
        );
        assert_eq!(
            failover_of("slave 127.0.0.1:6380 127.0.0.1 6380 @ mymaster 127.0.0.1 6379"),
            Some("mymaster")
        );
        assert_eq!(failover_of("sentinel 1 2 3"), None);
    }

    fn named(port: u16, epoch: u64, in_failover: bool) -> Named {
        Named {
            host: "127.0.0.1".into(),
            port,
            epoch,
            in_failover,
        }
    }

    fn pick(answers: &[Named], kept: Option<u16>) -> Option<u16> {
        choose(answers, |_, port| Some(port) == kept).map(|(_, port)| port)
    }

    #[test]
    fn the_highest_epoch_wins() {
        let answers = [
            named(6380, 1, false),
            named(6381, 2, false),
            named(6380, 1, false),
        ];
        assert_eq!(pick(&answers, Some(6380)), Some(6381));
        assert_eq!(pick(&[], None), None);
    }

    /// In a kill of the master, the leader gives the new epoch with the old
    /// address while it reconfigures the replicas: taking it would move
    /// lockd back to the dead master for half a second.
    #[test]
    fn a_sentinel_in_the_middle_of_a_failover_is_not_believed() {
        let answers = [
            named(6381, 3, false),
            named(6381, 3, false),
            named(6380, 3, true),
        ];
        for kept in [None, Some(6380), Some(6381)] {
            assert_eq!(pick(&answers, kept), Some(6381), "kept {kept:?}");
        }
        // The leader's answer in the other order too.
        let answers = [named(6380, 3, true), named(6381, 3, false)];
        assert_eq!(pick(&answers, Some(6380)), Some(6381));
        // When it is the only one that answers, it is all there is.
        assert_eq!(pick(&[named(6380, 3, true)], None), Some(6380));
    }

    #[test]
    fn a_tie_keeps_the_master_in_use_else_the_most_named() {
        let answers = [
            named(6380, 2, false),
            named(6381, 2, false),
            named(6381, 2, false),
        ];
        assert_eq!(pick(&answers, Some(6380)), Some(6380));
        assert_eq!(pick(&answers, None), Some(6381));
        assert_eq!(pick(&answers, Some(6399)), Some(6381));
    }
}
