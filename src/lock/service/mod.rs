//! [`Locks`]: the lock service the HTTP layer calls. It adds waiting to a
//! [`Store`]: a request may wait up to `wait` for a held lock (or, in
//! `permits`, for a free permit of a semaphore), woken by release events
//! and by the holder's lease running out, never by polling at a fixed
//! interval.
//!
//! # Layout
//! - this file: [`Locks`], the waits of locks, and what the store's change
//!   events are told to;
//! - `queue`: the per-instance wait queues, one per [`super::Subject`]:
//!   **where a release wakes a waiter** (the head of its subject's queue);
//! - `permits`: the waits of semaphore permits, through the same queues;
//! - [`watch`]: the watches, one follower task per watched subject;
//! - `listing`: listing across an API key's prefixes, one after another.
//!
//! # Cancel safety
//! An acquire runs in a task of its own. When the caller goes away (client
//! hung up, request timed out), the task finishes the backend call it is in,
//! and if that call granted the lock, releases it with a compare-and-delete:
//! a lock is never left set for a caller who will not see its token (field
//! case C08). When the backend call itself timed out, its outcome is unknown;
//! for a token lockd generated (nobody else can hold it) the Redis store
//! compare-and-deletes it once the stalled call has surely run or failed
//! (see [`super::redis`]). A client-chosen token is left alone: the client
//! may retry with it, and its retry must not be undone.

mod listing;
mod permits;
mod queue;
mod runs;
pub mod watch;

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use self::queue::{Begin, Handoff, Hint, LeaseEnd, Leaving, Offer, WaitQueues};
use self::watch::{SharedInterest, Watch, Watches};
use super::reaper::{Attempt, Reap, Reaped};
use super::{
    AcquireRequest, Acquired, Change, ChangeListener, ExtendTtl, Kind, Lease, LeaseLeft, LockError,
    LockInfo, LockName, Mode, Released, Store, Subject, Token,
};

/// The most random delay added to a retry at the holder's lease end, so that
/// the queue heads of several lockd instances do not all retry at the same
/// instant.
const EXPIRY_JITTER_MS: u64 = 5;

/// Told about every acquire that found its lock held on its first try
/// (whether it then failed at once, waited and got it, or timed out): the
/// measure of contention.
pub type ContentionHook = Arc<dyn Fn(&LockName) + Send + Sync>;

/// One try of a request that may wait (see [`Locks::wait_turn`]).
enum Tried<T, R> {
    /// The request is answered: granted, refused for good, or failed.
    Ended(T),
    /// The request is answered with a grant that keeps every other waiter
    /// of the subject out for this long (an exclusive lease's TTL), with
    /// this fence: the next waiter waits for its release rather than
    /// trying at once.
    Holds(T, Duration, u64),
    /// The request is answered with a shared lease: the shared waiters
    /// right behind it in the queue try at once (see
    /// [`queue::Place::admits_sharers`]).
    Shares(T),
    /// Held (or full): it may free when `left` runs out without a release
    /// (the head tries again then, or after [`LeaseLeft::retry_after`]'s
    /// suggestion for a key with no TTL); `refusal` is the answer should
    /// the wait end now.
    Busy {
        /// Until the holder's (or the earliest permit's) lease ends.
        left: LeaseLeft,
        /// The refusal to answer if the wait ends.
        refusal: R,
    },
}

/// How a wait with a [`Handoff`] reads what a release's try got for it.
type Judge<'a, T, R> = dyn Fn(Result<Acquired, LockError>) -> Tried<T, R> + Send + Sync + 'a;

/// How a wait ended.
enum Waited<T, R> {
    /// A try answered the request.
    Ended(T),
    /// Still busy when the wait ran out: it may free when `left` runs out;
    /// `refusal` is the last try's (`None` when this waiter never tried).
    TimedOut {
        /// Until the lease the waiters last learned of ends (or no end: a
        /// key with no TTL).
        left: LeaseLeft,
        /// The last try's refusal.
        refusal: Option<R>,
    },
}

/// What a waiter that looked found.
enum Looked {
    /// Nobody holds the lock: try.
    Free,
    /// Held, for this much longer.
    HeldFor(Duration),
    /// The store did not say: wait on as before.
    Unknown,
}

/// What the store's change events are told to: the wait queues and the
/// watches.
struct Listeners {
    queues: Arc<WaitQueues>,
    watches: Arc<Watches>,
}

impl ChangeListener for Listeners {
    fn changed(&self, subject: &Subject, change: &Change) {
        self.queues.changed(subject, change);
        self.watches.changed(subject, change);
    }

    fn resync(&self) {
        self.queues.resync();
        self.watches.resync();
    }

    fn subscribed(&self, subject: &Subject) {
        self.queues.subscribed(subject);
        self.watches.subscribed(subject);
    }
}

/// Locks with waiting, over one store. Cloning it shares it (one `Arc`).
#[derive(Clone)]
pub struct Locks(Arc<Shared>);

/// What the clones of one [`Locks`] share.
pub struct Shared {
    store: Arc<dyn Store>,
    queues: Arc<WaitQueues>,
    watches: Arc<Watches>,
    shutdown: CancellationToken,
    on_contention: Option<ContentionHook>,
    /// The semaphores this instance granted permits of (see
    /// [`permits::Known`]).
    known: Arc<permits::Known>,
    /// The locks this instance granted shared leases of.
    known_shared: Arc<permits::Known>,
}

impl std::ops::Deref for Locks {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl Locks {
    /// The service over `store`, with at most `max_waiters` requests
    /// waiting at once. Starts the store's release events, which stop with
    /// `shutdown`; cancelling `shutdown` also ends every wait with
    /// [`LockError::ShuttingDown`].
    pub fn new(store: Arc<dyn Store>, max_waiters: usize, shutdown: CancellationToken) -> Self {
        let queues = Arc::new(WaitQueues::new(max_waiters));
        let watches = Arc::new(Watches::new(store.clone(), shutdown.clone()));
        let listeners = Arc::new(Listeners {
            queues: queues.clone(),
            watches: watches.clone(),
        });
        if let Some(interest) = store.watch_releases(listeners, shutdown.clone()) {
            let shared: Arc<SharedInterest> = Arc::new(SharedInterest::new(interest));
            queues.tell(shared.clone());
            watches.tell(shared);
        }
        Self(Arc::new(Shared {
            store,
            queues,
            watches,
            shutdown,
            on_contention: None,
            known: Arc::default(),
            known_shared: Arc::default(),
        }))
    }

    /// Calls `hook` for every acquire that finds its lock held on its first
    /// try. Set it before the service is cloned: a clone made before keeps
    /// the hook it had.
    #[must_use]
    pub fn on_contention(self, hook: ContentionHook) -> Self {
        let shared = Arc::try_unwrap(self.0).unwrap_or_else(|shared| Shared {
            store: shared.store.clone(),
            queues: shared.queues.clone(),
            watches: shared.watches.clone(),
            shutdown: shared.shutdown.clone(),
            on_contention: shared.on_contention.clone(),
            known: shared.known.clone(),
            known_shared: shared.known_shared.clone(),
        });
        Self(Arc::new(Shared {
            on_contention: Some(hook),
            ..shared
        }))
    }

    /// Opens a watch of `subject` (see [`self::watch`]): its first event
    /// is what the lock or semaphore is now, then one event per change,
    /// until shutdown.
    ///
    /// # Errors
    /// [`LockError::TooManyWatchers`] when `max_watchers` watches are
    /// open; [`LockError::Unsupported`] from a store that cannot be
    /// watched (Redlock).
    pub fn watch(&self, subject: &Subject) -> Result<Watch, LockError> {
        self.store.watchable(subject)?;
        self.watches
            .watch(subject)
            .map_err(|_| LockError::TooManyWatchers)
    }

    /// Allows at most `max` watches open at once (default
    /// [`self::watch::DEFAULT_MAX_WATCHERS`]).
    pub fn set_max_watchers(&self, max: usize) {
        self.watches.set_max_watchers(max);
    }

    /// How many watches are open now.
    pub fn watching(&self) -> usize {
        self.watches.watching()
    }

    /// Calls `each(name, waiters)` for every subject of `kind` that has
    /// waiters now.
    pub fn for_each_queue(&self, kind: Kind, mut each: impl FnMut(&str, usize)) {
        self.queues.for_each_queue(|subject, n| {
            if subject.kind() == kind {
                each(subject.name().as_str(), n);
            }
        });
    }

    fn contended(&self, name: &LockName) {
        if let Some(hook) = &self.on_contention {
            hook(name);
        }
    }

    /// An acquire that does not wait: one try, counted as contention when
    /// the lock is held.
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquired, LockError> {
        let outcome = self.store.locks().acquire(req).await;
        if matches!(outcome, Err(LockError::Held { .. })) {
            self.contended(&req.name);
        }
        outcome
    }

    /// Takes the lock, waiting up to `wait` while another holder has it.
    /// With `wait` zero the request fails at once and is never queued, so it
    /// can take a free lock ahead of the queue.
    ///
    /// # Errors
    /// [`LockError::Held`] when `wait` is zero and the lock is held;
    /// [`LockError::WaitTimedOut`] when the wait ran out;
    /// [`LockError::TooManyWaiters`] when the lock is held and the queue is
    /// full; [`LockError::ShuttingDown`] when the service stops during the
    /// wait; [`LockError::Unavailable`] or [`LockError::Backend`] when the
    /// backend fails.
    pub async fn acquire(
        &self,
        req: AcquireRequest,
        wait: Duration,
    ) -> Result<Acquired, LockError> {
        let req = Arc::new(req);
        // Only a wait needs telling that its caller left.
        let caller_gone = (!wait.is_zero()).then(CancellationToken::new);
        let (this, op_req, told) = (self.clone(), req.clone(), caller_gone.clone());
        let op = Box::pin(async move { this.acquire_or_wait(&op_req, wait, told.as_ref()).await });
        let (name, mode) = (req.name.clone(), req.mode);
        let orphan = LockOrphan {
            locks: self.clone(),
            req,
        };
        let outcome = Attached::new(op, caller_gone, orphan).await;
        if mode == Mode::Shared && matches!(outcome, Ok(Acquired::Granted(_))) {
            self.known_shared.remember(&name);
        }
        outcome
    }

    /// How many live shared leases each lock this instance granted shared
    /// leases of has now, by every instance's holders, read from the store
    /// (each read bounded by `timeout`; one that fails is left out). A
    /// lock with none left is forgotten.
    pub async fn shared_held(&self, timeout: Duration) -> Vec<(String, usize)> {
        let store = self.store.locks();
        self.known_shared
            .counts(timeout, |name| async move {
                let info = store.inspect(&name).await?;
                Ok(info
                    .filter(|info| info.mode == Mode::Shared)
                    .map(|info| info.shared.len()))
            })
            .await
    }

    /// Releases a lock granted to a caller who went away: one attempt of
    /// the [`Reaper`](super::reaper) through the store (whose own release
    /// retries, for Redlock, the nodes it did not reach).
    async fn release_orphan(&self, req: &AcquireRequest) {
        let reap = Reap::at_once(Duration::ZERO);
        let outcome = reap
            .run(None, || async {
                // The store's own release: the next waiter wakes at its
                // change (no handoff from here, which a release makes).
                match self.store.locks().release(&req.name, &req.token).await {
                    // Not held by this token: the grant ended already (a
                    // release of the same token handed it on).
                    Ok(_) | Err(LockError::NotHeld | LockError::NotOwner) => Attempt::Done,
                    Err(e) => Attempt::Retry(e),
                }
            })
            .await;
        match outcome {
            Reaped::Done => {
                tracing::info!(lock = %req.name, "released a lock granted after its caller left");
            }
            Reaped::GaveUp(e) => tracing::warn!(
                lock = %req.name,
                error = %e,
                "could not release a lock granted after its caller left; it runs out with its TTL"
            ),
            Reaped::Stopped => {}
        }
    }

    async fn acquire_or_wait(
        &self,
        req: &AcquireRequest,
        wait: Duration,
        caller_gone: Option<&CancellationToken>,
    ) -> Result<Acquired, LockError> {
        if wait.is_zero() {
            return self.try_acquire(req).await;
        }
        // An exclusive request that waits says so, so that no new shared
        // lease is granted meanwhile (the writer rule).
        // Kept once, for the waiter's own tries and a release's.
        let attempt = Arc::new(Handoff::new(AcquireRequest {
            waits_until: (req.mode == Mode::Exclusive).then(|| Instant::now() + wait),
            ..req.clone()
        }));
        let judge = |outcome| match outcome {
            Err(LockError::Held { left }) => Tried::Busy { left, refusal: () },
            // Only under a token lockd generated: a client's token may be
            // the next waiter's too (a retry), whose try renews at once.
            Ok(Acquired::Granted(lease)) if req.mode == Mode::Exclusive && req.token_generated => {
                let (held, fence) = (lease.ttl.as_duration(), lease.fence);
                Tried::Holds(Ok(Acquired::Granted(lease)), held, fence)
            }
            Ok(granted @ Acquired::Granted(_)) if req.mode == Mode::Shared => {
                Tried::Shares(Ok(granted))
            }
            other => Tried::Ended(other),
        };
        // An exclusive waiter's acquire may be made by a release here.
        let handoff =
            (req.mode == Mode::Exclusive).then(|| (attempt.clone(), &judge as &Judge<'_, _, _>));
        let waited = self
            .wait_turn(
                &Subject::lock(req.name.clone()),
                wait,
                caller_gone,
                || self.contended(&req.name),
                || async { judge(self.store.locks().acquire(&attempt.req).await) },
                || self.look(&req.name),
                || self.renew_behind_others(req),
                handoff,
                req.mode == Mode::Shared,
            )
            .await?;
        match waited {
            Waited::Ended(outcome) => outcome,
            Waited::TimedOut { left, .. } => Err(LockError::WaitTimedOut { left }),
        }
    }

    /// Waits in `subject`'s queue, up to `wait`, while `attempt` finds the
    /// lock held (or the semaphore full): the wait of every request that
    /// may wait. Only the head of the queue tries: at once, when woken (a
    /// release event, the one ahead leaving), and when the holder's lease
    /// ends; when it was woken to look (see
    /// [`super::ChangeListener::subscribed`]), it calls `look` first and
    /// tries only if that finds it free; when the waiter ahead left
    /// holding the lock, it waits for that lease's release or end. The
    /// head tries once more at the deadline; a waiter whose try a release
    /// is making then stays for that try's answer (see
    /// [`queue::Handoff::time_out`]). `contended` is called once,
    /// when the request first finds it busy: behind others in the queue,
    /// or at its first try. A request that joins behind others first asks
    /// `behind`, which answers it at once when waiting cannot be its
    /// answer (its token holds already, or it names another limit than the
    /// one held), without taking anything ahead of the queue. With a
    /// `handoff` (an exclusive lock's acquire, and how to read its
    /// answer), a release on this instance may make the head's try for it
    /// while it sleeps (see [`Locks::release`]). A `shared` waiter (for a
    /// shared lease) tries beside the head too once the head's group was
    /// admitted (see [`queue::Place::admits_sharers`]), until a try finds
    /// the lock held.
    ///
    /// # Errors
    /// [`LockError::TooManyWaiters`] when the queues are full and the
    /// first try found it busy; [`LockError::ShuttingDown`] and
    /// [`LockError::Cancelled`] when the wait ended for those.
    // The wait's parts, each a closure of the caller's.
    #[allow(clippy::too_many_arguments)]
    async fn wait_turn<T, R, A, AF, L, LF, B, BF>(
        &self,
        subject: &Subject,
        wait: Duration,
        caller_gone: Option<&CancellationToken>,
        contended: impl Fn(),
        mut attempt: A,
        look: L,
        behind: B,
        handoff: Option<(Arc<Handoff>, &Judge<'_, T, R>)>,
        shared: bool,
    ) -> Result<Waited<T, R>, LockError>
    where
        A: FnMut() -> AF,
        AF: Future<Output = Tried<T, R>>,
        L: Fn() -> LF,
        LF: Future<Output = Looked>,
        B: FnOnce() -> BF,
        BF: Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + wait;
        let (handoff, judge) = match handoff {
            Some((handoff, judge)) => (Some(handoff), Some(judge)),
            None => (None, None),
        };
        // Join before the first attempt, so a release between a failed
        // attempt and the wait cannot be missed, and so that a newcomer does
        // not overtake the waiters already queued.
        let Ok(place) = self.queues.join_with(subject, handoff, shared) else {
            // No room to wait: a free lock (or permit) is still granted.
            return match attempt().await {
                Tried::Busy { .. } => {
                    contended();
                    Err(LockError::TooManyWaiters)
                }
                Tried::Ended(outcome) | Tried::Holds(outcome, ..) | Tried::Shares(outcome) => {
                    Ok(Waited::Ended(outcome))
                }
            };
        };
        let mut retry_at = Instant::now();
        let mut refusal = None;
        // Others waiting already means the lock is held: contention.
        let mut counted = !place.is_head();
        if counted {
            contended();
            if let Some(outcome) = behind().await {
                return Ok(Waited::Ended(outcome));
            }
        }
        let mut busy_once = || {
            if !std::mem::replace(&mut counted, true) {
                contended();
            }
        };
        // The wait ran out: the head tries once more, then the wait ends.
        let mut last_try = false;
        // Why the wait ends without an answer of a try, once it does.
        let mut ending: Option<Result<(), LockError>> = None;
        loop {
            // Taken before a try: a wake-up after it may mean that the
            // lease the try gets is gone already.
            let mark = place.mark();
            let mut tried = None;
            let mut may_try = ending.is_none();
            // The wait ran out while a release grants its acquire: it stays
            // for that answer (see `Handoff::time_out`).
            let mut awaits_hand = false;
            if let (Some(handoff), Some(judge)) = (place.handoff(), judge) {
                let begin = match &ending {
                    None => handoff.begin(),
                    // Leaving: what a release handed it is its answer.
                    Some(Err(_)) => handoff.leave().map_or(Begin::Wait, Begin::Handed),
                    Some(Ok(())) => match handoff.time_out() {
                        Leaving::Left => Begin::Wait,
                        Leaving::Handed(outcome) => Begin::Handed(outcome),
                        Leaving::Awaits => {
                            awaits_hand = true;
                            Begin::Wait
                        }
                    },
                };
                match begin {
                    Begin::Try => {}
                    Begin::Wait => may_try = false,
                    Begin::Handed(outcome) => {
                        may_try = false;
                        tried = Some(judge(outcome));
                    }
                }
            }
            if may_try && place.is_head() {
                let held_until = match place.take_hint() {
                    _ if last_try => Looked::Free,
                    Hint::Try => Looked::Free,
                    Hint::Look => {
                        // A look is no try: a release may make the try
                        // meanwhile, as while the waiter sleeps.
                        if let Some(handoff) = place.handoff() {
                            handoff.park();
                        }
                        let looked = look().await;
                        match place.handoff().map(Handoff::begin) {
                            None | Some(Begin::Try) => looked,
                            Some(Begin::Wait) => Looked::Unknown,
                            Some(Begin::Handed(outcome)) => {
                                tried = judge.map(|judge| judge(outcome));
                                Looked::Unknown
                            }
                        }
                    }
                    Hint::HeldUntil(until) => match until.checked_duration_since(Instant::now()) {
                        Some(left) if !left.is_zero() => Looked::HeldFor(left),
                        _ => Looked::Free,
                    },
                };
                match held_until {
                    Looked::HeldFor(left) => {
                        let lease_end = Instant::now() + left;
                        place.note_lease_end(LeaseEnd::By(lease_end));
                        retry_at = lease_end + jitter();
                    }
                    Looked::Unknown => {}
                    Looked::Free => tried = Some(attempt().await),
                }
            }
            match tried {
                Some(Tried::Busy {
                    left,
                    refusal: busy,
                }) => {
                    busy_once();
                    refusal = Some(busy);
                    let now = Instant::now();
                    place.note_lease_end(LeaseEnd::after(now, left));
                    // A key with no TTL: look again after the suggested
                    // retry (a release event wakes the head sooner).
                    retry_at = now + left.retry_after() + jitter();
                }
                Some(Tried::Ended(outcome)) => return Ok(Waited::Ended(outcome)),
                Some(Tried::Shares(outcome)) => {
                    place.admits_sharers();
                    return Ok(Waited::Ended(outcome));
                }
                Some(Tried::Holds(outcome, held, fence)) => {
                    place.leaves_holding(Instant::now() + held, fence, mark);
                    return Ok(Waited::Ended(outcome));
                }
                None => {}
            }
            match ending {
                Some(Err(e)) => return Err(e),
                Some(Ok(())) if awaits_hand => {}
                Some(Ok(())) => {
                    let lease_end = place.lease_end().unwrap_or(LeaseEnd::By(retry_at));
                    return Ok(Waited::TimedOut {
                        left: lease_end.left_at(Instant::now()),
                        refusal,
                    });
                }
                None if last_try => {
                    ending = Some(Ok(()));
                    continue;
                }
                None => {}
            }
            let head = place.is_head() && !awaits_hand;
            if let Some(handoff) = place.handoff().filter(|_| !awaits_hand) {
                handoff.park();
            }
            // Biased, in this order: once shutdown began, or the caller left,
            // a waiter must not try Redis again, even when its wake-up (the
            // waiter ahead of it leaving) is ready at the same moment.
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => ending = Some(Err(LockError::ShuttingDown)),
                () = cancelled(caller_gone) => ending = Some(Err(LockError::Cancelled)),
                () = place.woken() => {}
                () = sleep_until(retry_at), if head => {}
                // The lock may have freed without an event (a foreign
                // client deleted it): the head looks once more.
                () = sleep_until(deadline), if !awaits_hand => last_try = true,
            }
        }
    }

    /// For an acquire queued behind other waiters: when its token (one the
    /// client chose) holds the lock already, the retry renews the lease at
    /// once (to the requested TTL, keeping the fence), as it would at the
    /// head of the queue, and a token that holds it in the other mode is
    /// answered [`LockError::ModeMismatch`] at once (waiting would be for
    /// its own lease); otherwise it waits its turn, having taken nothing.
    async fn renew_behind_others(
        &self,
        req: &AcquireRequest,
    ) -> Option<Result<Acquired, LockError>> {
        if req.token_generated {
            return None;
        }
        let renew = AcquireRequest {
            renew_only: true,
            ..req.clone()
        };
        match self.store.locks().acquire(&renew).await {
            Ok(renewed @ Acquired::Renewed(_)) => Some(Ok(renewed)),
            Err(mismatch @ LockError::ModeMismatch { .. }) => Some(Err(mismatch)),
            _ => None,
        }
    }

    /// Whether `name` is still held, for a waiter woken to look (see
    /// [`super::ChangeListener::subscribed`]). An inspect has no effect,
    /// so a store that fails (a master failing over) leaves the waiter
    /// waiting, where a failed acquire would end its wait with 503.
    async fn look(&self, name: &LockName) -> Looked {
        match self.store.locks().inspect(name).await {
            Ok(None) => Looked::Free,
            Ok(Some(LockInfo {
                remaining: Some(remaining),
                ..
            })) => Looked::HeldFor(remaining),
            // Held without a TTL (a foreign client), or no answer.
            Ok(Some(_)) | Err(_) => Looked::Unknown,
        }
    }

    /// See [`LockStore::extend`](crate::lock::LockStore::extend).
    ///
    /// # Errors
    /// As for [`LockStore::extend`](crate::lock::LockStore::extend).
    pub async fn extend(
        &self,
        name: &LockName,
        token: &Token,
        ttl: ExtendTtl,
    ) -> Result<Lease, LockError> {
        self.store.locks().extend(name, token, ttl).await
    }

    /// See [`LockStore::release`](crate::lock::LockStore::release).
    ///
    /// # Errors
    /// As for [`LockStore::release`](crate::lock::LockStore::release).
    /// When the head of this lock's queue here is an exclusive waiter that
    /// sleeps, the release makes its try in the same step
    /// ([`LockStore::release_handing`](crate::lock::LockStore::release_handing))
    /// and hands it the answer: a handoff costs one round trip, where a
    /// release, its change message and the waiter's own try cost two and
    /// a hop. A caller who goes away meanwhile does not cut it off
    /// between the store's answer and the waiter's: what is left of it
    /// then runs on a task of its own.
    pub async fn release(&self, name: &LockName, token: &Token) -> Result<Released, LockError> {
        // Nobody waiting here (the common case) costs no lookup.
        let offer = (self.queues.waiting() > 0)
            .then(|| self.queues.offer(&Subject::lock(name.clone())))
            .flatten();
        let Some(offer) = offer else {
            return self.store.locks().release(name, token).await;
        };
        let (this, name, token) = (self.clone(), name.clone(), token.clone());
        let op = Box::pin(async move { this.hand_over(&name, &token, offer).await });
        Attached::new(op, None, Finish).await
    }

    /// Releases `name` for `token`, making `offer`'s try in the same step,
    /// and hands the waiter the answer; a grant for a waiter that left
    /// meanwhile is released.
    async fn hand_over(
        &self,
        name: &LockName,
        token: &Token,
        offer: Offer,
    ) -> Result<Released, LockError> {
        match self
            .store
            .locks()
            .release_handing(name, token, offer.req())
            .await
        {
            Ok((released, Some(outcome))) => {
                let handoff = offer.handoff();
                // As for any grant made after its caller left (see
                // `LockOrphan`): under a token lockd generated only.
                if let Some(Ok(Acquired::Granted(_))) = offer.hand(outcome)
                    && handoff.req.token_generated
                {
                    let this = self.clone();
                    tokio::spawn(async move { this.release_orphan(&handoff.req).await });
                }
                Ok(released)
            }
            Ok((released, None)) => {
                offer.withdraw();
                Ok(released)
            }
            Err(e) => {
                offer.withdraw();
                Err(e)
            }
        }
    }

    /// See [`LockStore::inspect`](crate::lock::LockStore::inspect).
    ///
    /// # Errors
    /// As for [`LockStore::inspect`](crate::lock::LockStore::inspect).
    pub async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>, LockError> {
        self.store.locks().inspect(name).await
    }

    /// See [`Store::ping`].
    ///
    /// # Errors
    /// As for [`Store::ping`].
    pub async fn ping(&self) -> Result<(), LockError> {
        self.store.ping().await
    }

    /// See [`Store::history`].
    ///
    /// # Errors
    /// As for [`Store::history`].
    pub async fn history(
        &self,
        subject: &Subject,
    ) -> Result<Vec<crate::lock::history::HistoryEntry>, LockError> {
        self.store.history(subject).await
    }

    /// See [`Store::break_leases`]: the waiters of `subject` wake at the
    /// change each end publishes, as at a release.
    ///
    /// # Errors
    /// As for [`Store::break_leases`].
    pub async fn break_leases(
        &self,
        subject: &Subject,
        fence: Option<u64>,
        by: &str,
    ) -> Result<Vec<crate::lock::history::BrokenLease>, LockError> {
        self.store.break_leases(subject, fence, by).await
    }
}

/// An acquire (of a lock, or of a permit), run in the caller's task (no
/// task of its own, on the uncontended path above all). If the caller goes
/// away before it ends (the client hung up), what is left of it runs to its
/// end on a task of its own, told that the caller left (so that a wait ends
/// at once), and `orphan` undoes a grant it makes then: an operation is
/// never cut off between sending a script and reading its answer.
struct Attached<T: Send + 'static, O: Orphan<T>> {
    op: Option<futures_util::future::BoxFuture<'static, Result<T, LockError>>>,
    caller_gone: Option<CancellationToken>,
    orphan: Option<O>,
}

/// Undoes a grant made for a caller who went away (see [`Attached`]).
trait Orphan<T>: Send + 'static {
    /// Undoes what `outcome` granted, if anything.
    fn undo(self, outcome: Result<T, LockError>) -> impl Future<Output = ()> + Send;
}

/// An [`Orphan`] with nothing to undo: the operation only has to run to
/// its end (a release that hands the lock to a waiter).
struct Finish;

impl Orphan<Released> for Finish {
    async fn undo(self, _outcome: Result<Released, LockError>) {}
}

/// A lock acquire's [`Orphan`]: releases a new grant.
struct LockOrphan {
    locks: Locks,
    req: Arc<AcquireRequest>,
}

impl Orphan<Acquired> for LockOrphan {
    async fn undo(self, outcome: Result<Acquired, LockError>) {
        match outcome {
            // Only under a token lockd generated: a client's own token
            // may have been answered as the holder through a retry of the
            // request (renewed), which a release would leave holding
            // nothing. The client may retry with it; else the lease runs
            // out with its TTL.
            Ok(Acquired::Granted(_)) if self.req.token_generated => {
                self.locks.release_orphan(&self.req).await;
            }
            // An exclusive wait that ended with its caller gone may have
            // been recorded as a waiting writer: a release of its token
            // withdraws it at once, so readers are not kept out until its
            // wait would have ended. Only for a token lockd generated,
            // which nothing else holds; a client's token may hold the lock
            // through another request, and its record ends with the wait.
            Err(LockError::Cancelled)
                if self.req.mode == Mode::Exclusive && self.req.token_generated =>
            {
                let _ = self.locks.release(&self.req.name, &self.req.token).await;
            }
            _ => {}
        }
    }
}

impl<T: Send + 'static, O: Orphan<T>> Attached<T, O> {
    fn new(
        op: futures_util::future::BoxFuture<'static, Result<T, LockError>>,
        caller_gone: Option<CancellationToken>,
        orphan: O,
    ) -> Self {
        Self {
            op: Some(op),
            caller_gone,
            orphan: Some(orphan),
        }
    }
}

impl<T: Send + 'static, O: Orphan<T> + Unpin> Future for Attached<T, O> {
    type Output = Result<T, LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(op) = self.op.as_mut() else {
            return Poll::Ready(Err(LockError::Unavailable(
                "the acquire was polled after it ended".into(),
            )));
        };
        let outcome = std::task::ready!(op.as_mut().poll(cx));
        self.op = None;
        Poll::Ready(outcome)
    }
}

impl<T: Send + 'static, O: Orphan<T>> Drop for Attached<T, O> {
    fn drop(&mut self) {
        let Some(op) = self.op.take() else { return };
        let Some(orphan) = self.orphan.take() else {
            return;
        };
        if let Some(caller_gone) = &self.caller_gone {
            caller_gone.cancel();
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { orphan.undo(op.await).await });
        }
    }
}

/// Completes when `token` is cancelled; never without one.
async fn cancelled(token: Option<&CancellationToken>) {
    match token {
        Some(token) => token.cancelled().await,
        None => std::future::pending().await,
    }
}

fn jitter() -> Duration {
    Duration::from_millis(rand::random_range(0..=EXPIRY_JITTER_MS))
}

#[cfg(test)]
mod tests {
    //! [`Locks`] over the memory backend, in paused time: every sleep and
    //! lease runs out at once when the runtime is idle, so each test reads
    //! the instants at which its waiters were answered.

    use super::*;
    use crate::lock::listing::{NamePrefix, PageSize, Position, ScanPage};
    use crate::lock::memory::MemoryBackend;
    use crate::lock::run::{
        Attempt as RunAttempt, Completed, RunInfo, RunMiss, RunResult, StartRefusal, StartRequest,
        Started,
    };
    use crate::lock::semaphore::{Permit, PermitOutcome, PermitRequest, Refusal, SemaphoreInfo};
    use crate::lock::{LockError, LockNode, Node, RunNode, SemaphoreNode, Single, Ttl};
    use async_trait::async_trait;

    const LONG: Duration = Duration::from_secs(60);

    fn name(s: &str) -> LockName {
        LockName::parse(s).expect("valid name")
    }

    fn request(lock: &str, token: &Token, ttl_ms: u64) -> AcquireRequest {
        AcquireRequest {
            name: name(lock),
            token: token.clone(),
            ttl: Ttl::from_millis(ttl_ms, u64::MAX, "ttl_ms").expect("valid ttl"),
            owner: None,
            meta: None,
            token_generated: true,
            mode: crate::lock::Mode::Exclusive,
            waits_until: None,
            renew_only: false,
        }
    }

    /// Takes the free lock `name` for `ttl_ms` under a token of its own.
    async fn hold(locks: &Locks, name: &str, ttl_ms: u64) {
        locks
            .acquire(request(name, &Token::generate(), ttl_ms), Duration::ZERO)
            .await
            .expect("free");
    }

    fn service(max_waiters: usize) -> (Arc<MemoryBackend>, Locks, CancellationToken) {
        let store = Arc::new(MemoryBackend::new());
        let shutdown = CancellationToken::new();
        let single = Arc::new(Single::new(store.clone()));
        let locks = Locks::new(single, max_waiters, shutdown.clone());
        (store, locks, shutdown)
    }

    /// How many requests wait for `lock` now.
    fn waiting(locks: &Locks, lock: &str) -> usize {
        let mut n = 0;
        locks.for_each_queue(Kind::Lock, |name, count| {
            if name == lock {
                n = count;
            }
        });
        n
    }

    /// Lets the other tasks run, without letting paused time advance, until
    /// `n` requests wait for `lock`.
    async fn until_waiting(locks: &Locks, lock: &str, n: usize) {
        for _ in 0..10_000 {
            if waiting(locks, lock) == n {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!(
            "expected {n} waiters for {lock}, have {}",
            waiting(locks, lock)
        );
    }

    /// Lets the other tasks run without letting paused time advance.
    async fn settle() {
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
    }

    type Answered = tokio::task::JoinHandle<(Result<Acquired, LockError>, Duration)>;

    /// Starts an acquire of `lock` under `token` that waits up to `wait`;
    /// its handle gives the outcome and how long after the start it came.
    fn waiter(locks: &Locks, lock: &str, token: &Token, wait: Duration) -> Answered {
        let (locks, req) = (locks.clone(), request(lock, token, 10_000));
        tokio::spawn(async move {
            let started = Instant::now();
            let outcome = locks.acquire(req, wait).await;
            (outcome, started.elapsed())
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_woken_by_the_release() {
        let (_, locks, _stop) = service(10);
        let a = Token::generate();
        locks
            .acquire(request("k", &a, 10_000), Duration::ZERO)
            .await
            .expect("free");
        let b = waiter(&locks, "k", &Token::generate(), LONG);
        until_waiting(&locks, "k", 1).await;
        locks.release(&name("k"), &a).await.expect("held");
        let (outcome, after) = b.await.expect("task");
        assert!(matches!(outcome, Ok(Acquired::Granted(_))), "{outcome:?}");
        assert!(
            after < Duration::from_millis(10),
            "woken at once: {after:?}"
        );
        assert_eq!(waiting(&locks, "k"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_granted_at_the_holders_lease_end() {
        let (_, locks, _stop) = service(10);
        hold(&locks, "k", 1_000).await;
        let b = waiter(&locks, "k", &Token::generate(), LONG);
        let (outcome, after) = b.await.expect("task");
        assert!(matches!(outcome, Ok(Acquired::Granted(_))), "{outcome:?}");
        // At the lease end, plus at most the jitter.
        assert!(
            after >= Duration::from_millis(1_000)
                && after <= Duration::from_millis(1_000 + EXPIRY_JITTER_MS + 1),
            "{after:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_runs_out_tells_when_the_lease_ends() {
        let (_, locks, _stop) = service(10);
        hold(&locks, "k", 10_000).await;
        let b = waiter(&locks, "k", &Token::generate(), Duration::from_secs(2));
        let (outcome, after) = b.await.expect("task");
        match outcome {
            Err(LockError::WaitTimedOut { left }) => {
                assert_eq!(left, LeaseLeft::AtMost(Duration::from_secs(8)));
            }
            other => panic!("expected WaitTimedOut, got {other:?}"),
        }
        assert_eq!(after, Duration::from_secs(2));
        assert_eq!(waiting(&locks, "k"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_lock_without_a_wait_is_refused_at_once() {
        let (_, locks, _stop) = service(10);
        hold(&locks, "k", 10_000).await;
        let outcome = locks
            .acquire(request("k", &Token::generate(), 10_000), Duration::ZERO)
            .await;
        assert!(
            matches!(outcome, Err(LockError::Held { left }) if left == LeaseLeft::AtMost(Duration::from_secs(10))),
            "{outcome:?}"
        );
    }

    /// Waiters are granted in arrival order, one try a handoff: the one
    /// behind a waiter that was granted does not try the lock it knows is
    /// held, only at its release (a try at each grant would make two).
    #[tokio::test(start_paused = true)]
    async fn waiters_are_granted_in_arrival_order_one_try_a_handoff() {
        let (store, locks, _stop) = slow_service(Duration::ZERO);
        let holder = Token::generate();
        locks
            .acquire(request("k", &holder, 10_000), Duration::ZERO)
            .await
            .expect("free");
        let tokens: Vec<Token> = (0..4).map(|_| Token::generate()).collect();
        let mut waiters = Vec::new();
        for (i, token) in tokens.iter().enumerate() {
            waiters.push(waiter(&locks, "k", token, LONG));
            until_waiting(&locks, "k", i + 1).await;
        }
        let before = store.tries();
        let mut previous = holder;
        for (i, (token, handle)) in tokens.iter().zip(waiters).enumerate() {
            locks.release(&name("k"), &previous).await.expect("held");
            let (outcome, after) = handle.await.expect("task");
            assert!(
                matches!(outcome, Ok(Acquired::Granted(_))),
                "waiter {i}: {outcome:?}"
            );
            assert!(after < LONG, "waiter {i} waited for the lease's end");
            settle().await;
            assert_eq!(store.tries() - before, i + 1, "tries after handoff {i}");
            previous = token.clone();
        }
    }

    /// Shared waiters queued behind an exclusive holder are granted
    /// together at its release (a try each, at once, not one after the
    /// other), up to the exclusive waiter queued among them, which keeps
    /// its place: no shared waiter behind it is granted before it.
    #[tokio::test(start_paused = true)]
    async fn queued_readers_are_granted_together_up_to_the_next_writer() {
        const TRY: Duration = Duration::from_millis(100);
        let (store, locks, _stop) = slow_service(TRY);
        let holder = Token::generate();
        locks
            .acquire(request("k", &holder, 10_000), Duration::ZERO)
            .await
            .expect("free");
        // Four readers, a writer, two readers, in this order.
        let modes = [true, true, true, true, false, true, true];
        let mut waiters = Vec::new();
        for (i, shared) in modes.into_iter().enumerate() {
            let mut req = request("k", &Token::generate(), 10_000);
            if shared {
                req.mode = crate::lock::Mode::Shared;
            }
            let this = locks.clone();
            waiters.push(tokio::spawn(async move {
                let started = Instant::now();
                let outcome = this.acquire(req, LONG).await;
                (outcome, started.elapsed())
            }));
            // Each first try (the head's) ends before the next joins.
            tokio::time::sleep(2 * TRY).await;
            until_waiting(&locks, "k", i + 1).await;
        }
        let released = Instant::now();
        locks.release(&name("k"), &holder).await.expect("held");
        let mut waiters = waiters.into_iter();
        for i in 0..4 {
            let (outcome, _) = waiters.next().expect("a reader").await.expect("task");
            assert!(
                matches!(outcome, Ok(Acquired::Granted(_))),
                "reader {i}: {outcome:?}"
            );
        }
        // The head's try, then the other three's at once: two tries long,
        // where one after another would be four.
        assert!(
            released.elapsed() <= 2 * TRY + TRY / 2,
            "the readers took {:?}",
            released.elapsed()
        );
        settle().await;
        assert_eq!(waiting(&locks, "k"), 3, "the writer and two readers wait");
        let tries = store.tries();
        tokio::time::sleep(10 * TRY).await;
        assert_eq!(waiting(&locks, "k"), 3, "nobody got past the writer");
        assert!(
            store.tries() <= tries + 1,
            "only the writer, at the head, tries while the readers hold it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_gone_mid_wait_leaves_no_lock_and_no_waiter() {
        let (store, locks, _stop) = service(10);
        let a = Token::generate();
        locks
            .acquire(request("k", &a, 10_000), Duration::ZERO)
            .await
            .expect("free");
        let b = waiter(&locks, "k", &Token::generate(), LONG);
        until_waiting(&locks, "k", 1).await;
        b.abort();
        assert!(b.await.is_err_and(|e| e.is_cancelled()));
        settle().await;
        assert_eq!(waiting(&locks, "k"), 0, "the wait ended with its caller");
        locks.release(&name("k"), &a).await.expect("held");
        tokio::time::sleep(LONG).await;
        assert_eq!(store.held_count(), 0, "nobody took the lock for it");
    }

    /// The waiter's release event comes while its caller is away (the
    /// future is not polled), and then the caller goes: the rest of the
    /// acquire runs on a task, hears that its caller left, and neither
    /// takes the lock nor stays queued.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_caller_left_before_its_turn_takes_nothing() {
        let (store, locks, _stop) = service(10);
        let a = Token::generate();
        locks
            .acquire(request("k", &a, 10_000), Duration::ZERO)
            .await
            .expect("free");
        let b = Token::generate();
        let mut pending = Box::pin(locks.acquire(request("k", &b, 10_000), LONG));
        assert!(futures_util::poll!(pending.as_mut()).is_pending());
        until_waiting(&locks, "k", 1).await;
        locks.release(&name("k"), &a).await.expect("held");
        drop(pending);
        settle().await;
        assert_eq!(waiting(&locks, "k"), 0, "the wait ended with its caller");
        assert_eq!(store.held_count(), 0, "nothing was granted for it");
    }

    /// A store whose acquires take `delay` (a slow Redis).
    struct Slow {
        inner: MemoryBackend,
        delay: Duration,
        /// How many acquires reached the store.
        tries: std::sync::atomic::AtomicUsize,
    }

    impl Slow {
        /// How many acquires reached the store so far.
        fn tries(&self) -> usize {
            self.tries.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    /// [`service`] over a [`Slow`] store whose acquires take `delay`.
    fn slow_service(delay: Duration) -> (Arc<Slow>, Locks, CancellationToken) {
        let store = Arc::new(Slow {
            inner: MemoryBackend::new(),
            delay,
            tries: Default::default(),
        });
        let shutdown = CancellationToken::new();
        let locks = Locks::new(Arc::new(Single::new(store.clone())), 10, shutdown.clone());
        (store, locks, shutdown)
    }

    #[async_trait]
    impl Node for Slow {
        async fn scan(
            &self,
            kind: Kind,
            prefix: &NamePrefix,
            at: &Position,
            limit: PageSize,
        ) -> Result<ScanPage, LockError> {
            Node::scan(&self.inner, kind, prefix, at, limit).await
        }

        async fn ping(&self) -> Result<(), LockError> {
            Ok(())
        }

        async fn history(
            &self,
            subject: &Subject,
        ) -> Result<Vec<crate::lock::history::HistoryEntry>, LockError> {
            Node::history(&self.inner, subject).await
        }

        async fn break_leases(
            &self,
            subject: &Subject,
            fence: Option<u64>,
            by: &str,
        ) -> Result<Vec<crate::lock::history::BrokenLease>, LockError> {
            Node::break_leases(&self.inner, subject, fence, by).await
        }

        fn watch_releases(
            &self,
            listener: Arc<dyn ChangeListener>,
            stop: CancellationToken,
        ) -> Option<Arc<dyn crate::lock::WaitInterest>> {
            self.inner.watch_releases(listener, stop)
        }
    }

    /// Its semaphores are the inner store's, as they are.
    #[async_trait]
    impl SemaphoreNode for Slow {
        async fn take_permit(
            &self,
            req: &PermitRequest,
        ) -> Result<Result<PermitOutcome, Refusal>, LockError> {
            SemaphoreNode::take_permit(&self.inner, req).await
        }

        async fn give_back_permit(
            &self,
            name: &LockName,
            token: &Token,
        ) -> Result<Option<Released>, LockError> {
            SemaphoreNode::give_back_permit(&self.inner, name, token).await
        }

        async fn extend_permit(
            &self,
            name: &LockName,
            token: &Token,
            ttl: ExtendTtl,
        ) -> Result<Option<Permit>, LockError> {
            SemaphoreNode::extend_permit(&self.inner, name, token, ttl).await
        }

        async fn inspect_semaphore(
            &self,
            name: &LockName,
        ) -> Result<Option<SemaphoreInfo>, LockError> {
            SemaphoreNode::inspect_semaphore(&self.inner, name).await
        }

        async fn probe_semaphore(
            &self,
            name: &LockName,
            marker: &str,
        ) -> Result<crate::lock::semaphore::ProbedSemaphore, LockError> {
            SemaphoreNode::probe_semaphore(&self.inner, name, marker).await
        }
    }

    /// Its runs are the inner store's, as they are.
    #[async_trait]
    impl RunNode for Slow {
        async fn start_run(
            &self,
            req: &StartRequest,
        ) -> Result<Result<Started, StartRefusal>, LockError> {
            RunNode::start_run(&self.inner, req).await
        }

        async fn complete_run(
            &self,
            key: &LockName,
            token: &Token,
            result: &RunResult,
            retention: Duration,
        ) -> Result<Result<Completed, RunMiss>, LockError> {
            RunNode::complete_run(&self.inner, key, token, result, retention).await
        }

        async fn abandon_run(
            &self,
            key: &LockName,
            token: &Token,
            retention: Duration,
        ) -> Result<Result<(), RunMiss>, LockError> {
            RunNode::abandon_run(&self.inner, key, token, retention).await
        }

        async fn extend_run(
            &self,
            key: &LockName,
            token: &Token,
            ttl: ExtendTtl,
            retention: Duration,
        ) -> Result<Result<RunAttempt, RunMiss>, LockError> {
            RunNode::extend_run(&self.inner, key, token, ttl, retention).await
        }

        async fn inspect_run(&self, key: &LockName) -> Result<Option<RunInfo>, LockError> {
            RunNode::inspect_run(&self.inner, key).await
        }

        async fn probe_run(
            &self,
            key: &LockName,
            marker: &str,
        ) -> Result<crate::lock::run::ProbedRun, LockError> {
            RunNode::probe_run(&self.inner, key, marker).await
        }
    }

    #[async_trait]
    impl LockNode for Slow {
        async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired, LockError> {
            self.tries
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(self.delay).await;
            self.inner.acquire(req).await
        }

        async fn extend(
            &self,
            name: &LockName,
            token: &Token,
            ttl: ExtendTtl,
        ) -> Result<Lease, LockError> {
            self.inner.extend(name, token, ttl).await
        }

        async fn release(&self, name: &LockName, token: &Token) -> Result<Released, LockError> {
            self.inner.release(name, token).await
        }

        async fn holder(&self, name: &LockName) -> Result<Option<(Token, LockInfo)>, LockError> {
            self.inner.holder(name).await
        }

        async fn probe(
            &self,
            name: &LockName,
            marker: &str,
        ) -> Result<crate::lock::ProbedLock, LockError> {
            self.inner.probe(name, marker).await
        }

        async fn raise_fence(
            &self,
            name: &LockName,
            token: &Token,
            fence: u64,
        ) -> Result<bool, LockError> {
            self.inner.raise_fence(name, token, fence).await
        }
    }

    /// Two waiters with one token of the client's (a retry queued behind
    /// the first request): when the first is granted, the second is
    /// answered at once with the renewal, not when its wait ends.
    #[tokio::test(start_paused = true)]
    async fn a_retry_queued_behind_its_own_grant_is_renewed_at_once() {
        let (_, locks, _stop) = service(10);
        let a = Token::generate();
        locks
            .acquire(request("k", &a, 10_000), Duration::ZERO)
            .await
            .expect("free");
        let t = Token::generate();
        let mine = |locks: &Locks| {
            let (locks, req) = (
                locks.clone(),
                AcquireRequest {
                    token_generated: false,
                    ..request("k", &t, 10_000)
                },
            );
            tokio::spawn(async move {
                let started = Instant::now();
                (locks.acquire(req, LONG).await, started.elapsed())
            })
        };
        let first = mine(&locks);
        until_waiting(&locks, "k", 1).await;
        let second = mine(&locks);
        until_waiting(&locks, "k", 2).await;
        locks.release(&name("k"), &a).await.expect("held");
        let (outcome, _) = first.await.expect("task");
        assert!(matches!(outcome, Ok(Acquired::Granted(_))), "{outcome:?}");
        let (outcome, after) = second.await.expect("task");
        assert!(matches!(outcome, Ok(Acquired::Renewed(_))), "{outcome:?}");
        assert!(after < Duration::from_secs(1), "answered late: {after:?}");
    }

    /// [`parked_behind_a`]'s service, A's token and W's wait.
    struct Parked {
        store: Arc<Slow>,
        locks: Locks,
        _stop: CancellationToken,
        a: Token,
        w: Answered,
    }

    /// A [`slow_service`] whose acquires take 100 ms, in which A holds
    /// "k" and W (`w_token`, waiting up to `wait`) waits behind it,
    /// `parked_for` after it began: its first try found the lock held, and
    /// it sleeps.
    async fn parked_behind_a(w_token: &Token, wait: Duration, parked_for: Duration) -> Parked {
        let (store, locks, stop) = slow_service(Duration::from_millis(100));
        let a = Token::generate();
        locks
            .acquire(request("k", &a, 10_000), Duration::ZERO)
            .await
            .expect("free");
        let w = waiter(&locks, "k", w_token, wait);
        until_waiting(&locks, "k", 1).await;
        tokio::time::sleep(parked_for).await;
        settle().await;
        assert_eq!(store.tries(), 2, "A's grant and W's first try");
        Parked {
            store,
            locks,
            _stop: stop,
            a,
            w,
        }
    }

    /// A release that makes the head waiter's try (a handoff) runs to its
    /// end when its caller goes away: the waiter is granted the lock, not
    /// left waiting for an answer nobody gives.
    #[tokio::test(start_paused = true)]
    async fn a_handoff_whose_releaser_left_still_grants_the_waiter() {
        let parked = parked_behind_a(&Token::generate(), LONG, Duration::from_millis(200)).await;
        let Parked {
            store, locks, a, w, ..
        } = parked;
        let k = name("k");
        let mut release = Box::pin(locks.release(&k, &a));
        // The release is done and W's try is under way: the caller leaves.
        assert!(futures_util::poll!(release.as_mut()).is_pending());
        drop(release);
        let (outcome, after) = w.await.expect("task");
        assert!(matches!(outcome, Ok(Acquired::Granted(_))), "{outcome:?}");
        assert!(after < Duration::from_secs(1), "granted late: {after:?}");
        assert_eq!(store.tries(), 3);
    }

    /// C08: the wait runs out while a release's try for the waiter (a
    /// handoff) is under way. The waiter stays for that answer and is
    /// granted, as with its own last try; it is not answered "timed out"
    /// while a grant made for it is undone behind it (the lock held for a
    /// moment under a token no client was given).
    #[tokio::test(start_paused = true)]
    async fn a_wait_that_runs_out_during_a_handoff_answers_the_handoffs_grant() {
        let w_token = Token::generate();
        // W waits until 300 ms.
        let wait = Duration::from_millis(300);
        let parked = parked_behind_a(&w_token, wait, Duration::from_millis(250)).await;
        let Parked {
            store, locks, a, w, ..
        } = parked;
        // The release's try for W takes 100 ms: it ends after W's deadline.
        locks.release(&name("k"), &a).await.expect("held");
        let (outcome, after) = w.await.expect("task");
        assert!(matches!(outcome, Ok(Acquired::Granted(_))), "{outcome:?}");
        assert!(after > Duration::from_millis(300), "{after:?}");
        settle().await;
        let held = store.inner.holder(&name("k")).await.expect("memory");
        assert_eq!(held.map(|(token, _)| token), Some(w_token));
    }

    /// A grant made after its caller left: released when lockd generated
    /// its token (nobody else can hold it), kept under a token of the
    /// client's, which a retry of the same request (here, or through
    /// another instance) may have been told it holds, renewed: releasing
    /// it then would leave that retry holding nothing.
    #[tokio::test(start_paused = true)]
    async fn a_grant_made_after_the_caller_left_is_released_unless_the_token_is_the_clients() {
        for generated in [true, false] {
            let (store, locks, _stop) = slow_service(Duration::from_millis(100));
            let req = AcquireRequest {
                token_generated: generated,
                ..request("k", &Token::generate(), 10_000)
            };
            let outcome = tokio::time::timeout(
                Duration::from_millis(50),
                locks.acquire(req, Duration::ZERO),
            )
            .await;
            assert!(outcome.is_err(), "the caller gave up during the store call");
            assert_eq!(store.inner.held_count(), 0);
            // The call goes on and grants.
            tokio::time::sleep(Duration::from_millis(100)).await;
            settle().await;
            let held = if generated { 0 } else { 1 };
            assert_eq!(
                store.inner.held_count(),
                held,
                "generated token: {generated}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_waiters_but_grants_a_free_lock() {
        let (_, locks, _stop) = service(1);
        hold(&locks, "k", 10_000).await;
        let _b = waiter(&locks, "k", &Token::generate(), LONG);
        until_waiting(&locks, "k", 1).await;
        let c = locks
            .acquire(request("k", &Token::generate(), 10_000), LONG)
            .await;
        assert!(matches!(c, Err(LockError::TooManyWaiters)), "{c:?}");
        let free = locks
            .acquire(request("free", &Token::generate(), 10_000), LONG)
            .await;
        assert!(matches!(free, Ok(Acquired::Granted(_))), "{free:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_every_wait() {
        let (_, locks, stop) = service(10);
        hold(&locks, "k", 10_000).await;
        let b = waiter(&locks, "k", &Token::generate(), LONG);
        let c = waiter(&locks, "k", &Token::generate(), LONG);
        until_waiting(&locks, "k", 2).await;
        stop.cancel();
        for handle in [b, c] {
            let (outcome, after) = handle.await.expect("task");
            assert!(
                matches!(outcome, Err(LockError::ShuttingDown)),
                "{outcome:?}"
            );
            assert!(after < Duration::from_millis(10), "{after:?}");
        }
        assert_eq!(waiting(&locks, "k"), 0);
    }

    fn permit(name_: &str, token: &Token, limit: u64) -> crate::lock::semaphore::PermitRequest {
        crate::lock::semaphore::PermitRequest {
            name: name(name_),
            token: token.clone(),
            limit: crate::lock::semaphore::Limit::new(limit, 100).expect("limit"),
            ttl: Ttl::from_millis(10_000, u64::MAX, "ttl_ms").expect("valid ttl"),
            owner: None,
            meta: None,
            token_generated: true,
        }
    }

    /// Waiters for permits of a semaphore of limit 2 are granted in
    /// arrival order, one per permit given back, and a wait that runs out
    /// is refused as full with when the earliest permit ends.
    #[tokio::test(start_paused = true)]
    async fn permit_waiters_are_granted_in_order_as_permits_are_given_back() {
        use crate::lock::semaphore::{PermitOutcome, Refusal};
        let (_, locks, _stop) = service(10);
        let holders: Vec<Token> = (0..2).map(|_| Token::generate()).collect();
        for holder in &holders {
            let taken = locks
                .take_permit(permit("pool", holder, 2), Duration::ZERO)
                .await;
            assert!(
                matches!(taken, Ok(Ok(PermitOutcome::Granted(_)))),
                "{taken:?}"
            );
        }
        let waiting: Vec<Token> = (0..2).map(|_| Token::generate()).collect();
        let mut handles = Vec::new();
        for (i, token) in waiting.iter().enumerate() {
            let (service, req) = (locks.clone(), permit("pool", token, 2));
            handles.push(tokio::spawn(
                async move { service.take_permit(req, LONG).await },
            ));
            for _ in 0..10_000 {
                let mut n = 0;
                locks.for_each_queue(Kind::Semaphore, |name, count| {
                    if name == "pool" {
                        n = count;
                    }
                });
                if n == i + 1 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        for (holder, handle) in holders.iter().zip(handles) {
            locks
                .give_back_permit(&name("pool"), holder)
                .await
                .expect("memory")
                .expect("held");
            let outcome = handle.await.expect("task");
            assert!(
                matches!(outcome, Ok(Ok(PermitOutcome::Granted(_)))),
                "{outcome:?}"
            );
        }
        let late = locks
            .take_permit(
                permit("pool", &Token::generate(), 2),
                Duration::from_secs(2),
            )
            .await;
        match late {
            Ok(Err(Refusal::Full { retry_after, limit })) => {
                assert_eq!(limit.get(), 2);
                assert_eq!(retry_after, Duration::from_secs(8));
            }
            other => panic!("expected full, got {other:?}"),
        }
    }
}
