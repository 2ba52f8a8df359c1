//! Watches: a stream of the changes of one lock (or semaphore), from any
//! lockd instance on the same Redis, for `GET /locks/{name}/events`.
//!
//! Every script that changes a lease publishes what it did on the lock's
//! change channel ([`crate::lock::change`]), in the same atomic step, so one
//! channel's messages arrive in the order of the changes. An instance
//! follows each watched lock with one task (a `Follower`), whatever the
//! number of its watchers, and sends every event to all of them.
//!
//! A lease that runs out publishes nothing: Redis's keyspace notifications
//! would say so, but they are off by default, node-local and late (field
//! case C23). The follower knows when each lease ends, and looks then: a
//! *probe* reads the lock and, in the same script, publishes a marker of
//! its own on the channel. When the marker comes back, every change made
//! before the read has arrived too, so the follower can tell a lease that
//! ran out (gone at the read, with no release before it: `expired`) from
//! one that was released (`released` came before the marker), exactly
//! (C22). The first read of a watch is a probe too: the changes that
//! arrive before its marker are already in what it read.
//!
//! When the change stream may have lost messages (the subscription was
//! lost and is back, a message this version does not understand), the
//! follower probes and, if what it knew differs from what it reads, sends
//! a fresh `state` event rather than guess what happened in between. What
//! it knew includes the fence counter (of a lock, or of a semaphore's
//! permits): grants made and ended in
//! the gap (the lock free before and after) leave the counter moved, and a
//! counter lost with Redis's data leaves none, so either gives a `state`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime};

use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::backoff::{Backoff, ExponentialBackoff};
use crate::lock::run::{ProbedRun, RunInfo};
use crate::lock::semaphore::{Limit, ProbedSemaphore};
use crate::lock::{
    Change, ChangeListener, Kind, LockError, Meta, Mode, ProbedLock, Store, Subject, WaitInterest,
};

/// The default of `--max-watchers`: open watches at once, per instance.
pub const DEFAULT_MAX_WATCHERS: usize = 10_000;

/// How long a follower waits for its probe's marker to come back before it
/// trusts the read alone (the change stream is down or late).
const MARKER_WAIT: Duration = Duration::from_secs(1);

/// How long after a lease's end (by this instance's clock, from when it
/// heard of the lease) the follower looks: Redis counts expiry in whole
/// milliseconds.
const EXPIRY_SLACK: Duration = Duration::from_millis(2);

/// The pauses between probes that failed (the store is down).
const PROBE_BACKOFF: ExponentialBackoff =
    ExponentialBackoff::new(Duration::from_millis(100), Duration::from_secs(2));

/// How many events a slow watcher may fall behind before it is sent a fresh
/// `state` in their place.
const BACKLOG: usize = 256;

/// One lease (a lock's holder, or one permit) as a watcher may see it:
/// never its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// The lease's fencing token (0 for a lock a foreign client set without
    /// one).
    pub fence: u64,
    /// The holder's label, when given.
    pub owner: Option<String>,
    /// The holder's metadata, when given.
    pub meta: Option<Meta>,
    /// When the lease ends, by this instance's wall clock; `None` when a
    /// foreign client set the lock without a TTL.
    pub expires_at: Option<SystemTime>,
    /// When the lease was granted, when known.
    pub granted_at: Option<SystemTime>,
    /// A lock's lease: exclusive or shared (a permit or a run's attempt:
    /// exclusive).
    pub mode: Mode,
}

/// What a watched lock, semaphore or run is: its live leases.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// A semaphore's limit, while a permit is held and once known.
    pub limit: Option<Limit>,
    /// The live leases, by fence (a lock, or a run's attempt: at most one).
    pub leases: Vec<LeaseView>,
    /// A run's state, beyond its live attempt (`None` for a lock or a
    /// semaphore).
    pub run: Option<RunStage>,
}

/// Where a watched run stands when no attempt holds it, or with one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStage {
    /// Never started, or its retention ended.
    Unknown,
    /// An attempt holds it (the snapshot's lease).
    Running,
    /// Started before; no attempt holds it now.
    Pending,
    /// Done, by the attempt with this fence.
    Done {
        /// The completing attempt's fence.
        fence: u64,
    },
}

impl Snapshot {
    /// The largest fence held, or 0.
    pub fn fence(&self) -> u64 {
        self.leases.iter().map(|l| l.fence).max().unwrap_or(0)
    }
}

/// One event of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// What the lock is now: the first event of every watch, and sent
    /// again when changes may have been missed.
    State(Snapshot),
    /// A new lease.
    Acquired(LeaseView),
    /// A lease reset to a new end (an extend, or its holder's renewal).
    Extended(LeaseView),
    /// A lease ended by its holder.
    Released {
        /// The lease's fence.
        fence: u64,
    },
    /// A lease an admin broke, whatever its token.
    Broken {
        /// The lease's fence.
        fence: u64,
        /// The id of the API key that broke it, when known.
        by: Option<String>,
    },
    /// A lease that ran out without a release.
    Expired {
        /// The lease's fence.
        fence: u64,
    },
    /// A run's attempt completed the run: it is done.
    Completed {
        /// The attempt's fence.
        fence: u64,
    },
}

impl WatchEvent {
    /// The fence the event is about (for a `state`, the largest held, or 0).
    pub fn fence(&self) -> u64 {
        match self {
            Self::State(snapshot) => snapshot.fence(),
            Self::Acquired(lease) | Self::Extended(lease) => lease.fence,
            Self::Released { fence }
            | Self::Broken { fence, .. }
            | Self::Expired { fence }
            | Self::Completed { fence } => *fence,
        }
    }
}

/// An event with its place in the follower's sequence: the events of one
/// follower are numbered 1, 2, ... (a `state` for a new watcher carries the
/// number of the last event before it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequenced {
    /// The number.
    pub seq: u64,
    /// The event.
    pub event: WatchEvent,
    /// How many leases are live after it (a lock: 0 or 1).
    pub holders: usize,
}

/// The watch cap was reached (`--max-watchers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyWatchers;

/// What a follower is told.
#[derive(Debug)]
enum Input {
    /// A message on the change channel.
    Change(Change),
    /// Messages may have been lost (the subscription is back).
    Resync,
    /// The subscription to this channel was (re)made.
    Subscribed,
}

/// What the follower of one subject shares with its watchers.
struct Channel {
    /// The last event's number and the snapshot after it; `None` until the
    /// first read.
    now: Mutex<Option<(u64, Snapshot)>>,
    events: broadcast::Sender<Arc<Sequenced>>,
    /// Whether the last read made before the first `state` failed (the
    /// store down, or not answering in time): a watcher still waiting for
    /// its first event is then told at once ([`Watch::first`]) rather than
    /// left to wait while the follower tries again.
    first_failed: watch::Sender<bool>,
}

impl Channel {
    fn now(&self) -> MutexGuard<'_, Option<(u64, Snapshot)>> {
        // Every critical section leaves it consistent.
        self.now.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new receiver, and the state to send first (none before the first
    /// read: the follower's first event is then that state).
    fn join(&self) -> (broadcast::Receiver<Arc<Sequenced>>, Option<Arc<Sequenced>>) {
        let now = self.now();
        let events = self.events.subscribe();
        let first = now.as_ref().map(|(seq, snapshot)| {
            Arc::new(Sequenced {
                seq: *seq,
                holders: snapshot.leases.len(),
                event: WatchEvent::State(snapshot.clone()),
            })
        });
        (events, first)
    }
}

/// One watched subject in [`Watches`].
struct Entry {
    inputs: mpsc::UnboundedSender<Input>,
    channel: Arc<Channel>,
    watchers: usize,
}

/// The watches of one lockd instance.
pub struct Watches {
    store: Arc<dyn Store>,
    entries: Mutex<HashMap<Subject, Entry>>,
    /// Open watches, over every subject.
    watching: AtomicUsize,
    max_watchers: AtomicUsize,
    /// The store's, when it subscribes lock by lock (a Redis Cluster).
    interest: OnceLock<Arc<dyn WaitInterest>>,
    shutdown: CancellationToken,
}

impl Watches {
    /// No watches yet, over `store`; every watch ends when `shutdown` is
    /// cancelled.
    pub fn new(store: Arc<dyn Store>, shutdown: CancellationToken) -> Self {
        Self {
            store,
            entries: Mutex::new(HashMap::new()),
            watching: AtomicUsize::new(0),
            max_watchers: AtomicUsize::new(DEFAULT_MAX_WATCHERS),
            interest: OnceLock::new(),
            shutdown,
        }
    }

    /// Tells `interest` from now on which subjects are watched (see
    /// [`WaitInterest`]). Set once; a second call is ignored.
    pub fn tell(&self, interest: Arc<dyn WaitInterest>) {
        let _ = self.interest.set(interest);
    }

    /// Allows at most `max` watches open at once.
    pub fn set_max_watchers(&self, max: usize) {
        self.max_watchers.store(max, Ordering::Relaxed);
    }

    /// How many watches are open now.
    pub fn watching(&self) -> usize {
        self.watching.load(Ordering::Acquire)
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<Subject, Entry>> {
        // Every critical section leaves the map consistent.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a watch of `subject`. Its first event is a
    /// [`WatchEvent::State`]; it ends when the service shuts down.
    ///
    /// # Errors
    /// [`TooManyWatchers`] when `--max-watchers` watches are open.
    pub fn watch(self: &Arc<Self>, subject: &Subject) -> Result<Watch, TooManyWatchers> {
        let max = self.max_watchers.load(Ordering::Relaxed);
        self.watching
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| TooManyWatchers)?;
        let mut entries = self.entries();
        let entry = entries.entry(subject.clone()).or_insert_with(|| {
            let (inputs, received) = mpsc::unbounded_channel();
            let (events, _) = broadcast::channel(BACKLOG);
            let channel = Arc::new(Channel {
                now: Mutex::new(None),
                events,
                first_failed: watch::Sender::new(false),
            });
            let follower = Follower::new(subject.clone(), channel.clone(), self.store.clone());
            let stop = self.shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = follower.run(received) => {}
                    () = stop.cancelled() => {}
                }
            });
            if let Some(interest) = self.interest.get() {
                interest.waiting(subject);
            }
            Entry {
                inputs,
                channel,
                watchers: 0,
            }
        });
        entry.watchers += 1;
        let channel = entry.channel.clone();
        drop(entries);
        let (events, first) = channel.join();
        let first_failed = channel.first_failed.subscribe();
        Ok(Watch {
            watches: self.clone(),
            subject: subject.clone(),
            channel,
            events,
            first_failed,
            first,
        })
    }

    /// Sends `input()` to the follower of `subject`, if it is watched
    /// (made only then: every change of every lock passes here).
    fn send(&self, subject: &Subject, input: impl FnOnce() -> Input) {
        if self.watching() == 0 {
            return;
        }
        if let Some(entry) = self.entries().get(subject) {
            let _ = entry.inputs.send(input());
        }
    }

    fn leave(&self, subject: &Subject) {
        let mut entries = self.entries();
        if let Some(entry) = entries.get_mut(subject) {
            entry.watchers -= 1;
            if entry.watchers == 0 {
                // Dropping its sender ends the follower.
                entries.remove(subject);
                if let Some(interest) = self.interest.get() {
                    interest.idle(subject);
                }
            }
        }
        drop(entries);
        self.watching.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ChangeListener for Watches {
    fn changed(&self, subject: &Subject, change: &Change) {
        self.send(subject, || Input::Change(change.clone()));
    }

    fn resync(&self) {
        if self.watching() == 0 {
            return;
        }
        for entry in self.entries().values() {
            let _ = entry.inputs.send(Input::Resync);
        }
    }

    fn subscribed(&self, subject: &Subject) {
        self.send(subject, || Input::Subscribed);
    }
}

/// One open watch: its events, in order.
pub struct Watch {
    watches: Arc<Watches>,
    subject: Subject,
    channel: Arc<Channel>,
    events: broadcast::Receiver<Arc<Sequenced>>,
    first: Option<Arc<Sequenced>>,
    first_failed: watch::Receiver<bool>,
}

impl Watch {
    /// The first event (the `state`), as [`Watch::next`]; or, while no
    /// `state` was told yet, [`LockError::Unavailable`] as soon as a read
    /// of the subject fails (the store down, or not answering within its
    /// timeout), so that a new watch fails as fast as any other request
    /// rather than wait for the follower's next try.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] as said.
    pub async fn first(&mut self) -> Result<Option<Arc<Sequenced>>, LockError> {
        if self.first.is_some() {
            return Ok(self.next().await);
        }
        let mut failed = self.first_failed.clone();
        loop {
            if *failed.borrow_and_update() {
                return Err(LockError::Unavailable(
                    "the first read of a watched subject failed".into(),
                ));
            }
            tokio::select! {
                next = self.next() => return Ok(next),
                changed = failed.changed() => {
                    if changed.is_err() {
                        // The follower is gone (shutdown): as `next` says.
                        return Ok(self.next().await);
                    }
                }
            }
        }
    }

    /// The next event, or `None` when the watch is over (shutdown).
    pub async fn next(&mut self) -> Option<Arc<Sequenced>> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        let next = tokio::select! {
            () = self.watches.shutdown.cancelled() => return None,
            next = self.events.recv() => next,
        };
        match next {
            Ok(event) => Some(event),
            // Fell behind: start again from what is now.
            Err(broadcast::error::RecvError::Lagged(_)) => {
                let (events, first) = self.channel.join();
                self.events = events;
                match first {
                    Some(first) => Some(first),
                    None => Box::pin(self.next()).await,
                }
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.watches.leave(&self.subject);
    }
}

/// A lease the follower knows of.
#[derive(Debug, Clone)]
struct Tracked {
    view: LeaseView,
    /// When it ends by this instance's monotonic clock (`None`: no TTL).
    ends: Option<Instant>,
}

impl Tracked {
    /// A lease that lasts `ttl` (none: no TTL) from `at`, as
    /// [`Self::reset`] counts it.
    fn new(
        fence: u64,
        owner: Option<String>,
        meta: Option<Meta>,
        granted_at: Option<SystemTime>,
        ttl: Option<Duration>,
        at: Option<SystemTime>,
    ) -> Self {
        let mut tracked = Self {
            view: LeaseView {
                fence,
                owner,
                meta,
                expires_at: None,
                granted_at,
                mode: Mode::Exclusive,
            },
            ends: None,
        };
        if let Some(ttl) = ttl {
            tracked.reset(ttl, at);
        }
        tracked
    }

    /// Resets the lease to end `ttl` after `at` (when the change was
    /// sent, by the clock of the lockd that sent it), or after now if that
    /// is sooner or unknown: an event heard late (this instance was
    /// stalled) says the lease it describes, not one from its hearing.
    fn reset(&mut self, ttl: Duration, at: Option<SystemTime>) {
        let now = SystemTime::now();
        let expires_at = at.map_or(now, |at| at.min(now)) + ttl;
        self.view.expires_at = Some(expires_at);
        self.ends = Some(Instant::now() + expires_at.duration_since(now).unwrap_or_default());
    }
}

/// What a probe read, as the follower keeps it.
#[derive(Debug, Clone, Default)]
struct Read {
    limit: Option<Limit>,
    leases: BTreeMap<u64, Tracked>,
    /// A run's state (`None` for a lock or a semaphore).
    run: Option<RunStage>,
    /// The fence counter at the read (see [`ProbedLock`]).
    counter: Option<u64>,
}

impl Read {
    fn of_lock(probed: ProbedLock) -> Self {
        let leases = match probed.holder {
            None => BTreeMap::new(),
            Some(info) if info.mode == Mode::Shared => info
                .shared
                .into_iter()
                .map(|lease| {
                    let mut tracked = Tracked::new(
                        lease.fence,
                        lease.owner,
                        lease.meta,
                        lease.granted_at,
                        Some(lease.remaining),
                        None,
                    );
                    tracked.view.mode = Mode::Shared;
                    (lease.fence, tracked)
                })
                .collect(),
            Some(info) => {
                let fence = info.fence.unwrap_or(0);
                let tracked = Tracked::new(
                    fence,
                    info.owner,
                    info.meta,
                    info.granted_at,
                    info.remaining,
                    None,
                );
                BTreeMap::from([(fence, tracked)])
            }
        };
        Self {
            limit: None,
            leases,
            run: None,
            counter: probed.counter,
        }
    }

    fn of_run(probed: ProbedRun) -> Self {
        let (stage, leases) = match probed.info {
            None => (RunStage::Unknown, BTreeMap::new()),
            Some(RunInfo::Running {
                fence,
                remaining,
                owner,
                meta,
                started_at,
                ..
            }) => {
                let tracked = Tracked::new(fence, owner, meta, started_at, Some(remaining), None);
                (RunStage::Running, BTreeMap::from([(fence, tracked)]))
            }
            Some(RunInfo::Pending { .. }) => (RunStage::Pending, BTreeMap::new()),
            Some(RunInfo::Done(done)) => (RunStage::Done { fence: done.fence }, BTreeMap::new()),
        };
        Self {
            limit: None,
            leases,
            run: Some(stage),
            counter: probed.counter,
        }
    }

    fn of_semaphore(probed: ProbedSemaphore) -> Self {
        let counter = probed.counter;
        let Some(info) = probed.info else {
            return Self {
                counter,
                ..Self::default()
            };
        };
        let leases = info
            .permits
            .into_iter()
            .map(|p| {
                let tracked = Tracked::new(
                    p.fence,
                    p.owner,
                    p.meta,
                    p.granted_at,
                    Some(p.remaining),
                    None,
                );
                (p.fence, tracked)
            })
            .collect();
        Self {
            limit: Some(info.limit),
            leases,
            run: None,
            counter,
        }
    }
}

/// Why a probe was made: what its marker settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// The first read: the changes before the marker are in it.
    First,
    /// A lease's end came: the changes before the marker are applied, then
    /// a lease the read does not have ran out.
    Expiry,
    /// Changes may have been missed: the changes before the marker are in
    /// the read, and, if it differs from what was known, it is sent as a
    /// fresh `state`.
    Resync,
    /// A semaphore's limit, which the change messages do not carry: the
    /// changes before the marker are applied, and the read gives the limit
    /// alone.
    Limit,
}

/// A probe whose marker has not come back yet.
struct Pending {
    marker: String,
    purpose: Purpose,
    read: Read,
    /// Past this, the read is trusted alone.
    until: Instant,
}

/// The markers of this process: a random part, so that two instances never
/// make the same, and a count.
static MARKER_BASE: LazyLock<String> = LazyLock::new(|| format!("{:016x}", rand::random::<u64>()));
static MARKERS: AtomicU64 = AtomicU64::new(0);

fn new_marker() -> String {
    format!(
        "{}.{}",
        *MARKER_BASE,
        MARKERS.fetch_add(1, Ordering::Relaxed)
    )
}

/// Follows one subject: applies its changes in order, probes at each
/// lease's end, and sends the events.
struct Follower {
    subject: Subject,
    channel: Arc<Channel>,
    store: Arc<dyn Store>,
    limit: Option<Limit>,
    leases: BTreeMap<u64, Tracked>,
    seq: u64,
    pending: Option<Pending>,
    /// A probe to make once the store answers again.
    retry: Option<(Instant, Purpose)>,
    backoff: Backoff,
    /// Whether the first `state` was told: once the first read's marker
    /// came back (the read came after the subscription to the subject's
    /// changes, so every change after it is heard), or was given up on.
    told_once: bool,
    /// A run's state (`None` for a lock or a semaphore).
    run: Option<RunStage>,
    /// A lock's fence counter as this follower knows it: from its last read,
    /// raised by every grant it hears of. A read after changes may have
    /// been missed that finds another tells of grants it did not hear of
    /// (or of a counter lost), so it sends a fresh `state`.
    counter: Option<u64>,
}

impl Follower {
    fn new(subject: Subject, channel: Arc<Channel>, store: Arc<dyn Store>) -> Self {
        Self {
            subject,
            channel,
            store,
            limit: None,
            leases: BTreeMap::new(),
            seq: 0,
            pending: None,
            retry: None,
            backoff: PROBE_BACKOFF.pauses(),
            told_once: false,
            run: None,
            counter: None,
        }
    }

    /// Runs until the last watcher leaves (the inputs end).
    async fn run(mut self, mut inputs: mpsc::UnboundedReceiver<Input>) {
        self.probe(Purpose::First).await;
        loop {
            let wake = self.next_wake();
            let sleep = async move {
                match wake {
                    Some(at) => sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                input = inputs.recv() => match input {
                    None => return,
                    Some(input) => self.input(input).await,
                },
                () = sleep => self.timer().await,
            }
        }
    }

    /// When the follower must act without an input: the probe to retry,
    /// the marker given up on, or the earliest lease's end.
    fn next_wake(&self) -> Option<Instant> {
        if let Some((at, _)) = self.retry {
            return Some(at);
        }
        if let Some(pending) = &self.pending {
            return Some(pending.until);
        }
        self.leases
            .values()
            .filter_map(|l| l.ends)
            .min()
            .map(|end| end + EXPIRY_SLACK)
    }

    async fn timer(&mut self) {
        if let Some((_, purpose)) = self.retry.take() {
            self.probe(purpose).await;
        } else if let Some(pending) = self.pending.take() {
            // The marker did not come back: trust the read alone.
            self.settle(pending, false);
        } else {
            self.probe(Purpose::Expiry).await;
        }
    }

    async fn input(&mut self, input: Input) {
        match input {
            Input::Change(Change::Probe(marker)) => {
                if self.pending.as_ref().is_some_and(|p| p.marker == marker)
                    && let Some(pending) = self.pending.take()
                {
                    self.settle(pending, true);
                }
            }
            // Before the marker of a first read, or of a read after changes
            // may have been missed: already in the read (and not to be
            // trusted one by one: a lost message, a Redis that lost its
            // data, would make them lie).
            Input::Change(_)
                if self
                    .pending
                    .as_ref()
                    .is_some_and(|p| matches!(p.purpose, Purpose::First | Purpose::Resync)) => {}
            Input::Change(change) => self.apply(change).await,
            // Before the first `state` is told, a subscription made (or a
            // connection back) makes the first read again: its marker will
            // be heard, and nothing between the read and the subscription
            // goes unheard.
            Input::Resync | Input::Subscribed => self.probe(Purpose::Resync).await,
        }
    }

    /// Reads the subject with a marker. A failed read is tried again after
    /// a pause.
    async fn probe(&mut self, purpose: Purpose) {
        // Before the first `state` is told, every probe is the first.
        let purpose = if self.told_once {
            purpose
        } else {
            Purpose::First
        };
        let marker = new_marker();
        let name = self.subject.name();
        let read = match self.subject.kind() {
            Kind::Lock => self
                .store
                .locks()
                .probe(name, &marker)
                .await
                .map(Read::of_lock),
            Kind::Semaphore => match self.store.semaphores() {
                Ok(semaphores) => semaphores
                    .probe_semaphore(name, &marker)
                    .await
                    .map(Read::of_semaphore),
                Err(e) => Err(e),
            },
            Kind::Run => match self.store.runs() {
                Ok(runs) => runs.probe_run(name, &marker).await.map(Read::of_run),
                Err(e) => Err(e),
            },
        };
        let read = match read {
            Ok(read) => read,
            Err(e) => {
                if !matches!(e, LockError::Unsupported(_)) {
                    tracing::debug!(error = %e, lock = %name, "a watch could not read the lock; trying again");
                    self.retry = Some((Instant::now() + self.backoff.next_pause(), purpose));
                }
                if !self.told_once {
                    self.channel.first_failed.send_replace(true);
                }
                return;
            }
        };
        self.backoff.reset();
        self.retry = None;
        self.channel.first_failed.send_replace(false);
        if purpose == Purpose::First {
            self.limit = read.limit;
            self.counter = read.counter;
            self.run = read.run;
            self.leases = read.leases.clone();
        }
        self.pending = Some(Pending {
            marker,
            purpose,
            read,
            until: Instant::now() + MARKER_WAIT,
        });
    }

    /// What the marker of `pending` settles; `heard` is whether it came
    /// back (every change before the read was applied).
    fn settle(&mut self, pending: Pending, heard: bool) {
        let read = pending.read;
        match pending.purpose {
            // Told now, not at the read: a read made before the
            // subscription was confirmed, and told at once, would have a
            // change made in between come later as a `state` of its own,
            // not as the change (a read again after the subscription
            // cannot tell it from a change it missed).
            Purpose::First => {
                self.told_once = true;
                let snapshot = self.snapshot();
                self.emit(WatchEvent::State(snapshot));
            }
            Purpose::Limit => {
                if !self.leases.is_empty() && read.limit.is_some() {
                    self.limit = read.limit;
                    self.refresh();
                }
            }
            Purpose::Expiry | Purpose::Resync => {
                let gone: Vec<u64> = self
                    .leases
                    .keys()
                    .filter(|f| !read.leases.contains_key(f))
                    .copied()
                    .collect();
                let new = read.leases.keys().any(|f| !self.leases.contains_key(f));
                let sure = heard && pending.purpose == Purpose::Expiry;
                // After a gap, grants may have come and gone unheard: the
                // counter tells (a lock free before and after included).
                let missed = pending.purpose == Purpose::Resync
                    && (read.counter != self.counter || read.run != self.run);
                // Every change before the marker is in the read.
                self.counter = read.counter;
                if read.limit.is_some() {
                    self.limit = read.limit;
                }
                if !new && !missed && (gone.is_empty() || sure) {
                    // The leases both know take the read's ends.
                    for (fence, tracked) in read.leases {
                        if let Some(known) = self.leases.get_mut(&fence) {
                            known.ends = tracked.ends;
                            known.view.expires_at = tracked.view.expires_at;
                        }
                    }
                    // What watchers to come are told, with no event.
                    self.refresh();
                    for fence in gone {
                        self.leases.remove(&fence);
                        self.emptied();
                        if self.run.is_some() {
                            self.run = Some(RunStage::Pending);
                        }
                        self.emit(WatchEvent::Expired { fence });
                    }
                } else {
                    self.limit = read.limit;
                    self.run = read.run;
                    self.leases = read.leases;
                    let snapshot = self.snapshot();
                    self.emit(WatchEvent::State(snapshot));
                }
            }
        }
    }

    /// Applies one change, in order.
    async fn apply(&mut self, change: Change) {
        match change {
            Change::Acquired {
                fence,
                ttl_ms,
                granted_at_ms,
                owner,
                meta,
                mode,
            } => {
                if self.leases.contains_key(&fence) {
                    return;
                }
                if matches!(self.subject.kind(), Kind::Lock | Kind::Run) {
                    if self.leases.keys().any(|&f| f > fence) {
                        // Older than what is known.
                        return;
                    }
                    // An exclusive lease is alone, and a shared one is
                    // never beside an exclusive one: the leases before it
                    // that it cannot be beside ended, and no release came,
                    // so they ran out.
                    let ended: Vec<u64> = self
                        .leases
                        .iter()
                        .filter(|(_, t)| mode == Mode::Exclusive || t.view.mode == Mode::Exclusive)
                        .map(|(f, _)| *f)
                        .collect();
                    for ended in ended {
                        self.leases.remove(&ended);
                        self.emit(WatchEvent::Expired { fence: ended });
                    }
                }
                self.counter = Some(self.counter.map_or(fence, |c| c.max(fence)));
                if self.run.is_some() {
                    self.run = Some(RunStage::Running);
                }
                let granted_at = (granted_at_ms > 0)
                    .then(|| SystemTime::UNIX_EPOCH + Duration::from_millis(granted_at_ms));
                let ttl = Some(Duration::from_millis(ttl_ms));
                let mut tracked = Tracked::new(fence, owner, meta, granted_at, ttl, granted_at);
                tracked.view.mode = mode;
                let view = tracked.view.clone();
                self.leases.insert(fence, tracked);
                self.emit(WatchEvent::Acquired(view));
                if self.subject.kind() == Kind::Semaphore
                    && self.limit.is_none()
                    && self.pending.is_none()
                {
                    // The limit is not in the message: read it.
                    self.probe(Purpose::Limit).await;
                }
            }
            Change::Extended {
                fence,
                ttl_ms,
                at_ms,
            } => match self.leases.get_mut(&fence) {
                Some(tracked) => {
                    let at = at_ms.map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
                    tracked.reset(Duration::from_millis(ttl_ms), at);
                    let view = tracked.view.clone();
                    self.emit(WatchEvent::Extended(view));
                }
                // A lease never heard of: a message was missed.
                None => self.probe(Purpose::Resync).await,
            },
            Change::Released { fence } => {
                if self.leases.remove(&fence).is_some() {
                    self.emptied();
                    if self.run.is_some() {
                        self.run = Some(RunStage::Pending);
                    }
                    self.emit(WatchEvent::Released { fence });
                }
            }
            Change::Broken { fence, by } => {
                if self.leases.remove(&fence).is_some() {
                    self.emptied();
                    if self.run.is_some() {
                        self.run = Some(RunStage::Pending);
                    }
                    self.emit(WatchEvent::Broken { fence, by });
                }
            }
            Change::Completed { fence } => {
                if self.leases.remove(&fence).is_some() {
                    self.run = Some(RunStage::Done { fence });
                    self.emit(WatchEvent::Completed { fence });
                } else {
                    // An attempt never heard of: a message was missed.
                    self.probe(Purpose::Resync).await;
                }
            }
            Change::Expired { fence } => {
                if self.leases.remove(&fence).is_some() {
                    self.emptied();
                    self.emit(WatchEvent::Expired { fence });
                }
            }
            Change::Unknown => self.probe(Purpose::Resync).await,
            // Not this follower's marker (another instance's, or given up).
            Change::Probe(_) => {}
        }
    }

    /// A semaphore with no permit left has no limit.
    fn emptied(&mut self) {
        if self.leases.is_empty() {
            self.limit = None;
        }
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            limit: self.limit,
            leases: self.leases.values().map(|t| t.view.clone()).collect(),
            run: self.run,
        }
    }

    /// Keeps the state as it is now for the watchers to come.
    fn refresh(&self) {
        let snapshot = self.snapshot();
        *self.channel.now() = Some((self.seq, snapshot));
    }

    /// Sends `event` to every watcher, and keeps the state after it for
    /// the watchers to come.
    fn emit(&mut self, event: WatchEvent) {
        self.seq += 1;
        let snapshot = self.snapshot();
        let mut now = self.channel.now();
        *now = Some((self.seq, snapshot));
        // No receiver is not an error: the watchers may all be between
        // two events.
        let _ = self.channel.events.send(Arc::new(Sequenced {
            seq: self.seq,
            event,
            holders: self.leases.len(),
        }));
    }
}

/// A [`WaitInterest`] shared by the wait queues and the watches: the store
/// is told that a subject is wanted when the first of either wants it, and
/// idle when the last of both leaves.
pub struct SharedInterest {
    inner: Arc<dyn WaitInterest>,
    counts: Mutex<HashMap<Subject, usize>>,
}

impl SharedInterest {
    /// Counts the wants of `inner`'s subjects.
    pub fn new(inner: Arc<dyn WaitInterest>) -> Self {
        Self {
            inner,
            counts: Mutex::new(HashMap::new()),
        }
    }
}

impl WaitInterest for SharedInterest {
    fn waiting(&self, subject: &Subject) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(subject.clone()).or_insert(0);
        *count += 1;
        if *count == 1 {
            self.inner.waiting(subject);
        }
    }

    fn idle(&self, subject: &Subject) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(subject) {
            *count -= 1;
            if *count == 0 {
                counts.remove(subject);
                self.inner.idle(subject);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_heard_late_keeps_the_end_it_was_sent_with() {
        let mut lease = Tracked::new(7, None, None, None, Some(Duration::from_secs(60)), None);
        let sent = SystemTime::now() - Duration::from_secs(80);
        lease.reset(Duration::from_secs(6), Some(sent));
        // Sent 80 s ago for 6 s: it ended 74 s ago, and the follower looks
        // at once.
        assert_eq!(lease.view.expires_at, Some(sent + Duration::from_secs(6)));
        assert!(lease.ends.is_some_and(|end| end <= Instant::now()));
        // A clock ahead of this one's counts from now instead.
        let ahead = SystemTime::now() + Duration::from_secs(30);
        lease.reset(Duration::from_secs(6), Some(ahead));
        let left = lease
            .view
            .expires_at
            .and_then(|at| at.duration_since(SystemTime::now()).ok());
        assert!(
            left.is_some_and(|left| left <= Duration::from_secs(6)),
            "{left:?}"
        );
        // Unknown: from now.
        lease.reset(Duration::from_secs(6), None);
        assert!(lease.ends.is_some_and(|end| end > Instant::now()));
    }
}
