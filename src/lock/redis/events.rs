//! Change events from Redis: how one lockd instance learns of every change
//! of a lock or semaphore it waits for or watches, by any client, and tells
//! the service's listeners (the wait queues and the watches).
//!
//! Every script that changes a lease publishes what it did (see
//! [`crate::lock::change`]) on its subject's channel, `P{N}:released` for
//! lock `N`, `Psem:{N}:released` for semaphore `N` and `Prun:{N}:released`
//! for run `N` (built by
//! [`channel`], the one place channel names are made). Two ways to hear
//! them, each subscribing subject by subject while one of the instance's
//! waiters found the subject held or one of its watches follows it, and
//! unsubscribing when the last of them leaves
//! ([`crate::lock::WaitInterest`]), so that an instance is sent only the
//! messages of what it waits for:
//! - [`ChannelEvents`], on one Redis server (single mode, or the master of
//!   a Sentinel set, moving with it): one connection per instance, with
//!   `SUBSCRIBE P{N}:released` for each subject waited for. The scripts
//!   `PUBLISH`; a message nobody subscribed to costs Redis a lookup and
//!   no delivery.
//! - [`ShardedEvents`], on a Redis Cluster: the scripts publish with
//!   `SPUBLISH` (sharded pub/sub, Redis 7), which travels only within the
//!   shard that owns the lock's slot, where `PUBLISH` would be copied to
//!   every node of the cluster. Each `SSUBSCRIBE P{N}:released` is sent
//!   to the master of the channel's slot, and made again there when the
//!   cluster's masters change.
//!
//! Either way, events may be missed while a subscription is being made or
//! remade (a first waiter, a new connection, a failover, a slot that
//! moved): after every subscription the subject's waiters look once, after
//! every new connection all waiters retry once, and until then they fall
//! back to the holder's lease end.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt as _;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::{Instant, sleep_until};

use super::connect::{Client, ConnectReport, PushHandler, RedisTls};
use super::pool::{ClusterTarget, KnownNodes};
use super::sentinel::Sentinels;
use crate::backoff::ExponentialBackoff;
use crate::lock::{Change, ChangeListener, Kind, LockError, LockName, Subject, WaitInterest};

/// The pauses between tries to (re)subscribe: 50 ms doubling up to 2 s.
const EVENTS_BACKOFF: ExponentialBackoff =
    ExponentialBackoff::new(Duration::from_millis(50), Duration::from_secs(2));

/// After this many failed rounds of subscriptions in a row, the sharded
/// subscriber opens a new cluster connection (with a fresh slot map).
const ROUNDS_BEFORE_RECONNECT: u32 = 4;

/// The change channel of the `kind` of lease named `name` under key
/// prefix `prefix`: `P{N}:released` for lock `N`, `Psem:{N}:released`
/// for semaphore `N` and `Prun:{N}:released` for run `N`. The one place where channel names are built: the
/// scripts are given theirs, and the subscribers parse them back with
/// [`subject_of`].
pub fn channel(prefix: &str, kind: Kind, name: &LockName) -> String {
    let name = name.as_str();
    match kind {
        Kind::Lock => super::joined(&[prefix, "{", name, "}:released"]),
        Kind::Semaphore => super::joined(&[prefix, "sem:{", name, "}:released"]),
        Kind::Run => super::joined(&[prefix, "run:{", name, "}:released"]),
    }
}

/// The subject of a change channel under key prefix `prefix` (the reverse
/// of [`channel`]); `None` for another channel, or a name no lock can
/// have (another client's).
fn subject_of(prefix: &str, channel: &str) -> Option<Subject> {
    let rest = channel.strip_prefix(prefix)?;
    let (kind, rest) = if let Some(rest) = rest.strip_prefix("sem:") {
        (Kind::Semaphore, rest)
    } else if let Some(rest) = rest.strip_prefix("run:") {
        (Kind::Run, rest)
    } else {
        (Kind::Lock, rest)
    };
    let name = rest.strip_prefix('{')?.strip_suffix("}:released")?;
    LockName::parse(name)
        .ok()
        .map(|name| Subject::new(kind, name))
}

/// The release-event subscriber of one Redis server (single mode, or the
/// master of a Sentinel set, moving with it): one connection per lockd
/// instance, subscribed (`SUBSCRIBE`) to the channel of each subject one
/// of its waiters found held or one of its watches follows, and
/// unsubscribed when the last of them leaves. A lock nobody here waits for
/// costs the instance nothing: its change messages are not sent to it.
pub struct ChannelEvents {
    /// The server (one client; several are tried in turn).
    clients: Arc<[Client]>,
    /// In Sentinel mode: the subscription goes to the master now, and moves
    /// when it changes.
    sentinels: Option<Arc<Sentinels>>,
    /// TLS failures to subscribe are reported with the pool's.
    report: Arc<ConnectReport>,
    /// The key prefix `P`.
    prefix: String,
    /// How long connecting, and each (un)subscription, may take.
    timeout: Duration,
    listener: Arc<dyn ChangeListener>,
    /// What the wait queues and watches want, in the order they said it.
    changes: mpsc::UnboundedReceiver<Want>,
    /// The subjects wanted now, subscribed or to be on the next connection.
    wanted: HashSet<Subject>,
}

/// Why [`ChannelEvents::follow`] returned.
enum Heard {
    /// The wait queues are gone.
    Stop,
    /// The connection was lost or failed a command, or the master changed.
    Lost,
}

impl ChannelEvents {
    /// The subscriber of `clients` (tried in turn) or, with `sentinels`, of
    /// the master they name, telling `listener` of the changes of subjects
    /// under key prefix `prefix`; and the [`WaitInterest`] to tell it which
    /// subjects are waited for. Nothing is opened until
    /// [`ChannelEvents::run`].
    pub fn new(
        clients: Arc<[Client]>,
        sentinels: Option<Arc<Sentinels>>,
        report: Arc<ConnectReport>,
        prefix: &str,
        timeout: Duration,
        listener: Arc<dyn ChangeListener>,
    ) -> (Self, Arc<dyn WaitInterest>) {
        let (tx, changes) = mpsc::unbounded_channel();
        let events = Self {
            clients,
            sentinels,
            report,
            prefix: prefix.to_owned(),
            timeout,
            listener,
            changes,
            wanted: HashSet::new(),
        };
        (events, Arc::new(Interest(tx)))
    }

    /// Connects, subscribes to what is wanted, and follows the changes of
    /// what is wanted and the messages, for ever; reconnects with capped
    /// exponential backoff when the connection is lost or the master
    /// changes. After every (re)connection all waiters retry once, since
    /// changes may have been missed meanwhile.
    pub async fn run(mut self) {
        let mut backoff = EVENTS_BACKOFF.pauses();
        // Without Sentinels, the clients are tried in turn.
        let mut next = 0usize;
        // Whether a subscription was lost, so that its return is logged.
        let mut lost = false;
        loop {
            let mut masters = self.sentinels.as_ref().map(|s| s.changes());
            let client = match &self.sentinels {
                Some(sentinels) => match sentinels.master().await {
                    Ok((client, _)) => client,
                    Err(e) => {
                        tracing::debug!(error = %e, "no master to subscribe to release events on");
                        backoff.wait().await;
                        continue;
                    }
                },
                None => {
                    let Some(client) = self.clients.get(next % self.clients.len().max(1)) else {
                        return;
                    };
                    next = next.wrapping_add(1);
                    client.clone()
                }
            };
            // What was said while there was no connection.
            while let Ok(want) = self.changes.try_recv() {
                self.want(want);
            }
            match self.connect(&client).await {
                Ok((sink, stream)) => {
                    backoff.reset();
                    if std::mem::take(&mut lost) {
                        tracing::info!(
                            node = %client.connection_info().addr(),
                            "release-event connection to Redis is back; waiters retry and watches read their subjects again"
                        );
                    }
                    self.listener.resync();
                    if let Heard::Stop = self.follow(sink, stream, masters.as_mut()).await {
                        return;
                    }
                    lost = true;
                    tracing::warn!(
                        node = %client.connection_info().addr(),
                        "release-event connection to Redis lost; waiters fall back to lease expiry until it is back"
                    );
                }
                Err(e) => tracing::debug!(error = %e, "cannot subscribe to release events"),
            }
            backoff.wait().await;
        }
    }

    /// Records one change of what is wanted; whether it asks for a
    /// (un)subscription: `Some(true)` subscribe, `Some(false)`
    /// unsubscribe.
    fn want(&mut self, want: Want) -> Option<(bool, Subject)> {
        match want {
            Want::Waiting(subject) => self
                .wanted
                .insert(subject.clone())
                .then_some((true, subject)),
            Want::Idle(subject) => self.wanted.remove(&subject).then_some((false, subject)),
        }
    }

    /// Opens a connection to `client` and subscribes it to every channel
    /// wanted, within the timeout.
    async fn connect(
        &self,
        client: &Client,
    ) -> Result<(redis::aio::PubSubSink, redis::aio::PubSubStream), String> {
        let channels: Vec<String> = self
            .wanted
            .iter()
            .map(|s| channel(&self.prefix, s.kind(), s.name()))
            .collect();
        let connect = async {
            let (mut sink, stream) = client.pubsub().await?.split();
            if !channels.is_empty() {
                sink.subscribe(&channels).await?;
            }
            Ok::<_, redis::RedisError>((sink, stream))
        };
        match tokio::time::timeout(self.timeout, connect).await {
            Ok(Ok(pair)) => {
                self.report.connected();
                Ok(pair)
            }
            Ok(Err(e)) => {
                self.report.failed(&e);
                Err(e.to_string())
            }
            Err(_) => Err("timed out".into()),
        }
    }

    /// Hears messages and follows what is wanted on one connection, until
    /// the wait queues are gone or the connection must be replaced.
    async fn follow(
        &mut self,
        mut sink: redis::aio::PubSubSink,
        mut stream: redis::aio::PubSubStream,
        mut masters: Option<&mut watch::Receiver<u64>>,
    ) -> Heard {
        loop {
            let master_changed = async {
                match masters.as_mut() {
                    Some(masters) => {
                        let _ = masters.changed().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                msg = stream.next() => {
                    let Some(msg) = msg else { return Heard::Lost };
                    if let Some(subject) = subject_of(&self.prefix, msg.get_channel_name()) {
                        let change = Change::parse(msg.get_payload_bytes());
                        self.listener.changed(&subject, &change);
                    }
                }
                want = self.changes.recv() => {
                    let Some(want) = want else { return Heard::Stop };
                    let Some((subscribe, subject)) = self.want(want) else { continue };
                    let name = channel(&self.prefix, subject.kind(), subject.name());
                    let sent = async {
                        if subscribe {
                            sink.subscribe(&name).await
                        } else {
                            sink.unsubscribe(&name).await
                        }
                    };
                    match tokio::time::timeout(self.timeout, sent).await {
                        Ok(Ok(())) => {
                            tracing::trace!(%subject, subscribe, "change events (un)subscribed");
                            // A change may have come before the subscription:
                            // the subject's waiters look once.
                            if subscribe {
                                self.listener.subscribed(&subject);
                            }
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, subscribe, "a release-event subscription failed");
                            return Heard::Lost;
                        }
                        Err(_) => {
                            tracing::debug!(subscribe, "a release-event subscription timed out");
                            return Heard::Lost;
                        }
                    }
                }
                () = master_changed => return Heard::Lost,
            }
        }
    }
}

/// A change in what this instance waits for.
enum Want {
    Waiting(Subject),
    Idle(Subject),
}

/// The [`WaitInterest`] of [`ShardedEvents`]: queues each change for its
/// task.
struct Interest(mpsc::UnboundedSender<Want>);

impl WaitInterest for Interest {
    fn waiting(&self, subject: &Subject) {
        let _ = self.0.send(Want::Waiting(subject.clone()));
    }

    fn idle(&self, subject: &Subject) {
        let _ = self.0.send(Want::Idle(subject.clone()));
    }
}

/// Which subjects' channels are wanted, and which the cluster confirmed.
#[derive(Default)]
struct Subscribed {
    /// Subjects that some waiter or watch of this instance waits for.
    wanted: HashSet<Subject>,
    /// Subjects whose subscription a node confirmed (and has not dropped).
    confirmed: HashSet<Subject>,
}

/// What the cluster connection's pushes and the subscriber's task share.
struct Shared {
    state: Mutex<Subscribed>,
    /// Poked when a wanted subscription was lost (its slot moved, or a
    /// node's connection dropped).
    lost: Notify,
    listener: Arc<dyn ChangeListener>,
    prefix: String,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, Subscribed> {
        // Every critical section leaves the sets consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One push from a node (on the connection's task: never blocks).
    fn on_push(&self, push: &PushInfo) {
        let name = push.data.first().and_then(|v| match v {
            Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
            _ => None,
        });
        let subject = name.and_then(|channel| subject_of(&self.prefix, channel));
        match (&push.kind, subject) {
            (PushKind::SMessage, Some(subject)) => {
                tracing::trace!(%subject, "change event");
                let change = match push.data.get(1) {
                    Some(Value::BulkString(message)) => Change::parse(message),
                    _ => Change::Unknown,
                };
                self.listener.changed(&subject, &change);
            }
            // A subscription is in place: a release may have come before
            // it, so the lock's head looks once. (It may be a replica's
            // answer while its master is down: the head only looks.)
            (PushKind::SSubscribe, Some(subject)) => {
                tracing::debug!(%subject, "change events subscribed");
                self.state().confirmed.insert(subject.clone());
                self.listener.subscribed(&subject);
            }
            // Ours, or the node's when the slot moved away from it.
            (PushKind::SUnsubscribe, Some(subject)) => {
                tracing::trace!(%subject, "change events unsubscribed");
                let mut state = self.state();
                state.confirmed.remove(&subject);
                if state.wanted.contains(&subject) {
                    drop(state);
                    self.lost.notify_one();
                }
            }
            (PushKind::Disconnection, _) => {
                tracing::debug!("a release-event connection to a cluster node dropped");
                // Which node it was is not told: subscribe again to all.
                self.state().confirmed.clear();
                self.lost.notify_one();
            }
            (kind, _) => tracing::trace!(?kind, "other push"),
        }
    }
}

/// Why [`ShardedEvents::follow`] returned.
enum Follow {
    /// The wait queues are gone.
    Stop,
    /// The cluster's masters changed.
    MastersChanged,
    /// Subscriptions kept failing.
    Failing,
}

/// The release-event subscriber of a Redis Cluster: sharded pub/sub, one
/// subscription per lock that a waiter of this instance waits for.
pub struct ShardedEvents {
    target: ClusterTarget,
    /// Changes of the cluster's masters: a connection opened before may
    /// hold subscriptions on a master that was replaced (frozen, not
    /// disconnected), so the subscriber starts afresh.
    masters: watch::Receiver<u64>,
    shared: Arc<Shared>,
    changes: mpsc::UnboundedReceiver<Want>,
    report: Arc<ConnectReport>,
    timeout: Duration,
}

impl ShardedEvents {
    /// The subscriber of the cluster found from `seeds` (see
    /// [`ClusterTarget::new`]; `known` is shared with the pool's target),
    /// telling `listener` of releases of locks with key prefix `prefix`,
    /// and the [`WaitInterest`] to tell it which locks are waited for.
    /// Nothing is opened until [`ShardedEvents::run`].
    ///
    /// # Errors
    /// [`LockError::Backend`] when the seeds cannot be used.
    pub fn new(
        seeds: Vec<String>,
        tls: RedisTls,
        known: KnownNodes,
        listener: Arc<dyn ChangeListener>,
        prefix: &str,
        report: Arc<ConnectReport>,
        timeout: Duration,
    ) -> Result<(Self, Arc<dyn WaitInterest>), LockError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(Subscribed::default()),
            lost: Notify::new(),
            listener,
            prefix: prefix.to_owned(),
        });
        let pushes = shared.clone();
        let push: PushHandler = Arc::new(move |push: PushInfo| pushes.on_push(&push));
        let masters = known.changes();
        let target = ClusterTarget::new(seeds, tls, timeout, Some(push), known)?;
        let (tx, changes) = mpsc::unbounded_channel();
        let events = Self {
            target,
            masters,
            shared,
            changes,
            report,
            timeout,
        };
        Ok((events, Arc::new(Interest(tx))))
    }

    /// Connects, then follows what is waited for, for ever: subscribes
    /// each newly waited-for lock, unsubscribes each one nobody waits for
    /// any more, and subscribes again the ones lost. A connection that
    /// keeps failing is replaced.
    pub async fn run(mut self) {
        let mut backoff = EVENTS_BACKOFF.pauses();
        loop {
            let conn = match tokio::time::timeout(self.timeout, self.target.connect()).await {
                Ok(Ok(conn)) => {
                    self.report.connected();
                    conn
                }
                Ok(Err(e)) => {
                    self.report.failed(&e);
                    tracing::debug!(error = %e, "cannot connect to the Redis Cluster for release events");
                    backoff.wait().await;
                    continue;
                }
                Err(_) => {
                    backoff.wait().await;
                    continue;
                }
            };
            backoff.reset();
            self.shared.state().confirmed.clear();
            self.masters.mark_unchanged();
            match self.follow(conn).await {
                Follow::Stop => return,
                Follow::MastersChanged => {}
                Follow::Failing => tracing::warn!(
                    "release-event subscriptions to the Redis Cluster keep failing; reconnecting (waiters fall back to lease expiry meanwhile)"
                ),
            }
        }
    }

    /// Follows the changes on `conn`, until the wait queues are gone
    /// (shutdown) or `conn` should be replaced.
    async fn follow(&mut self, mut conn: ClusterConnection) -> Follow {
        let mut pauses = EVENTS_BACKOFF.pauses();
        let mut failed_rounds = 0;
        // Subscribe at once to whatever is wanted already.
        let mut retry_at = Some(Instant::now());
        loop {
            let retry = async move {
                match retry_at {
                    Some(at) => sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                change = self.changes.recv() => match change {
                    None => return Follow::Stop,
                    Some(Want::Waiting(subject)) => {
                        let fresh = {
                            let mut state = self.shared.state();
                            state.wanted.insert(subject.clone());
                            !state.confirmed.contains(&subject)
                        };
                        if fresh && !self.command(&mut conn, true, &subject).await {
                            retry_at.get_or_insert_with(|| Instant::now() + pauses.next_pause());
                        }
                        continue;
                    }
                    Some(Want::Idle(subject)) => {
                        {
                            let mut state = self.shared.state();
                            state.wanted.remove(&subject);
                            state.confirmed.remove(&subject);
                        }
                        // A failure leaves a subscription nobody needs:
                        // its events wake nobody.
                        let _ = self.command(&mut conn, false, &subject).await;
                        continue;
                    }
                },
                () = self.shared.lost.notified() => {}
                () = retry => {}
                changed = self.masters.changed() => {
                    if changed.is_ok() {
                        tracing::debug!("the cluster's masters changed: subscribing afresh");
                        return Follow::MastersChanged;
                    }
                }
            }
            // Subscribe again to every wanted lock not confirmed.
            let missing: Vec<Subject> = {
                let state = self.shared.state();
                state.wanted.difference(&state.confirmed).cloned().collect()
            };
            let mut all = true;
            for name in &missing {
                all &= self.command(&mut conn, true, name).await;
            }
            if all {
                pauses.reset();
                failed_rounds = 0;
                retry_at = None;
            } else {
                failed_rounds += 1;
                if failed_rounds >= ROUNDS_BEFORE_RECONNECT {
                    return Follow::Failing;
                }
                retry_at = Some(Instant::now() + pauses.next_pause());
            }
        }
    }

    /// `SSUBSCRIBE` (or `SUNSUBSCRIBE`) the channel of `subject` on the master
    /// of its slot, within the timeout; whether it was answered.
    ///
    /// Sent with [`ClusterConnection::route_command`] to the master rather
    /// than with the connection's own `ssubscribe`: that one counts
    /// `SSUBSCRIBE` as a read, and while a master is down it subscribes on
    /// one of its replicas instead, where the subscription is dropped (or,
    /// if another replica is promoted, goes deaf) at the failover. Sent to
    /// the master, it fails while the master is down and is tried again
    /// until the new master answers. The confirmation is both the answer
    /// and a push (see [`Shared::on_push`]).
    async fn command(
        &self,
        conn: &mut ClusterConnection,
        subscribe: bool,
        subject: &Subject,
    ) -> bool {
        let channel = channel(&self.shared.prefix, subject.kind(), subject.name());
        let mut cmd = redis::cmd(if subscribe {
            "SSUBSCRIBE"
        } else {
            "SUNSUBSCRIBE"
        });
        cmd.arg(&channel);
        let master = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
            &channel,
            SlotAddr::Master,
        )));
        match tokio::time::timeout(self.timeout, conn.route_command(cmd, master)).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, subscribe, "a release-event subscription failed");
                false
            }
            Err(_) => false,
        }
    }
}

/// Escapes the glob characters of Redis patterns (`*?[]\`).
pub fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("lockd:"), "lockd:");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    fn name(name: &str) -> LockName {
        LockName::parse(name).expect("a name")
    }

    #[test]
    fn a_channel_names_its_subject() {
        let lock = Subject::lock(name("orders:1"));
        let named = channel("lockd:", Kind::Lock, lock.name());
        assert_eq!(named, "lockd:{orders:1}:released");
        assert_eq!(subject_of("lockd:", &named), Some(lock));
        assert_eq!(subject_of("other:", &named), None);
        assert_eq!(subject_of("lockd:", "lockd:{x}:fence"), None);
        let pool = Subject::semaphore(name("pool"));
        let named = channel("lockd:", Kind::Semaphore, pool.name());
        assert_eq!(named, "lockd:sem:{pool}:released");
        assert_eq!(subject_of("lockd:", &named), Some(pool));
        assert_eq!(subject_of("lockd:", "lockd:sem:{pool}:permits"), None);
    }
}
