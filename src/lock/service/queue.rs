//! Per-instance wait queues: who waits for which lock or semaphore (one
//! queue per [`Subject`]), in arrival order.
//!
//! Only the head of a subject's queue retries; the others sleep until they
//! become head. A release event wakes the head only, so one release costs one
//! retry per lockd instance, not one per waiter (no thundering herd). The
//! one exception is a group of readers: once a shared waiter at the head is
//! granted, the shared waiters right behind it try at once, each for a
//! lease of its own, until one of them is refused
//! ([`Place::admits_sharers`]).
//!
//! Each waiter has its own [`Notify`]. `notify_one` stores a permit when the
//! waiter is not parked yet, so a wake-up that arrives between a failed
//! attempt and the next `notified().await` is never lost.
//!
//! A store that subscribes to change events subject by subject (sharded
//! pub/sub on a Redis Cluster) is told through its [`WaitInterest`] when a
//! subject gets its first waiter that found it held, and when its last waiter
//! leaves; a wait that got a free lock at its first try costs no
//! subscription.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lock::{
    AcquireRequest, Acquired, Change, ChangeListener, LeaseLeft, LockError, Subject, WaitInterest,
};

struct Waiter {
    id: u64,
    wake: Arc<Notify>,
    /// Its acquire, when a release may grant it in the same step.
    handoff: Option<Arc<Handoff>>,
    /// Whether it waits for a shared lease (see [`Queue::admit_sharers`]).
    shared: bool,
    /// Whether it tries as a head does, though others are ahead of it: it
    /// waits for a shared lease, and so do all ahead of it, the first of
    /// whom was granted one (see [`Queue::admit_sharers`]).
    admitted: Arc<AtomicBool>,
}

/// An exclusive lock's waiter's acquire, which a release on this instance
/// may grant in its own step while the waiter is parked (see
/// [`WaitQueues::offer`]): one round trip a handoff, not a release, its
/// change message and the waiter's own try.
pub struct Handoff {
    /// What the waiter tries.
    pub req: AcquireRequest,
    turn: Mutex<Turn>,
}

/// Where a [`Handoff`] stands.
enum Turn {
    /// The waiter is trying, or about to: not offered.
    Trying,
    /// The waiter sleeps: a release may take it.
    Parked,
    /// A release is granting it: the waiter does not try meanwhile.
    Taken,
    /// The release's try, for the waiter to answer.
    Handed(Result<Acquired, LockError>),
    /// The waiter left: a grant made for it is released by the releaser.
    Left,
}

/// What a waiter with a [`Handoff`] does next (see [`Handoff::begin`]).
pub enum Begin {
    /// Try, as any waiter.
    Try,
    /// Wait: a release is granting it.
    Wait,
    /// Answer what a release's try got for it.
    Handed(Result<Acquired, LockError>),
}

/// How a waiter whose wait ran out leaves (see [`Handoff::time_out`]).
pub enum Leaving {
    /// It left; nothing was handed to it.
    Left,
    /// A release's try, handed to it before it left: its answer.
    Handed(Result<Acquired, LockError>),
    /// A release is granting its acquire: it stays for the answer.
    Awaits,
}

impl Handoff {
    /// The handoff of `req`'s waiter, which is trying at first.
    pub fn new(req: AcquireRequest) -> Self {
        Self {
            req,
            turn: Mutex::new(Turn::Trying),
        }
    }

    fn turn(&self) -> MutexGuard<'_, Turn> {
        // Every critical section leaves the turn whole.
        self.turn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before the waiter tries: whether it may, must wait for a release's
    /// try, or has that try's answer.
    pub fn begin(&self) -> Begin {
        let mut turn = self.turn();
        match std::mem::replace(&mut *turn, Turn::Trying) {
            Turn::Taken => {
                *turn = Turn::Taken;
                Begin::Wait
            }
            Turn::Handed(outcome) => Begin::Handed(outcome),
            Turn::Left => {
                *turn = Turn::Left;
                Begin::Try
            }
            Turn::Trying | Turn::Parked => Begin::Try,
        }
    }

    /// The waiter sleeps: a release may take its try from now on.
    pub fn park(&self) {
        let mut turn = self.turn();
        if matches!(*turn, Turn::Trying) {
            *turn = Turn::Parked;
        }
    }

    /// The waiter leaves: the answer of a release's try that it did not
    /// read yet, which is now its to give (or to undo).
    pub fn leave(&self) -> Option<Result<Acquired, LockError>> {
        match std::mem::replace(&mut *self.turn(), Turn::Left) {
            Turn::Handed(outcome) => Some(outcome),
            _ => None,
        }
    }

    /// The waiter's wait ran out: it leaves as with [`Handoff::leave`],
    /// unless a release is granting its acquire now, whose answer comes
    /// within that release's round trip and is the wait's to give, as the
    /// answer of the waiter's own last try would be. Leaving then instead
    /// would leave the grant to be undone after the waiter was answered
    /// 409: for a moment the lock would be held under a token no client
    /// was given (C08).
    pub fn time_out(&self) -> Leaving {
        let mut turn = self.turn();
        match std::mem::replace(&mut *turn, Turn::Left) {
            Turn::Handed(outcome) => Leaving::Handed(outcome),
            Turn::Taken => {
                *turn = Turn::Taken;
                Leaving::Awaits
            }
            _ => Leaving::Left,
        }
    }

    fn take(&self) -> bool {
        let mut turn = self.turn();
        let parked = matches!(*turn, Turn::Parked);
        if parked {
            *turn = Turn::Taken;
        }
        parked
    }
}

/// A parked waiter's acquire, taken by a release on this instance (see
/// [`WaitQueues::offer`]). Exactly one of [`Offer::hand`] and
/// [`Offer::withdraw`] ends it; dropped without either, it is withdrawn.
pub struct Offer {
    handoff: Arc<Handoff>,
    wake: Arc<Notify>,
    done: bool,
}

impl Offer {
    /// What the waiter tries.
    pub fn req(&self) -> &AcquireRequest {
        &self.handoff.req
    }

    /// The waiter's handoff (its acquire), shared.
    pub fn handoff(&self) -> Arc<Handoff> {
        self.handoff.clone()
    }

    /// Gives the waiter the release's try, and wakes it. When the waiter
    /// left meanwhile, the answer comes back (a grant is the caller's to
    /// undo).
    pub fn hand(
        mut self,
        outcome: Result<Acquired, LockError>,
    ) -> Option<Result<Acquired, LockError>> {
        self.done = true;
        let mut turn = self.handoff.turn();
        if matches!(*turn, Turn::Left) {
            return Some(outcome);
        }
        *turn = Turn::Handed(outcome);
        drop(turn);
        self.wake.notify_one();
        None
    }

    /// No try was made for the waiter: it tries for itself, at once.
    pub fn withdraw(mut self) {
        self.done = true;
        self.give_back();
    }

    fn give_back(&self) {
        let mut turn = self.handoff.turn();
        if matches!(*turn, Turn::Taken) {
            *turn = Turn::Trying;
        }
        drop(turn);
        self.wake.notify_one();
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        if !self.done {
            self.give_back();
        }
    }
}

/// The waiters of one lock, and what they know of its holder.
#[derive(Default)]
struct Queue {
    waiters: VecDeque<Waiter>,
    /// When the holder's lease ends, as the last failed try learned it.
    lease_end: Option<LeaseEnd>,
    /// Whether the store was told that this lock is waited for.
    subscribed: bool,
    /// Whether the head should look before it retries (see
    /// [`ChangeListener::subscribed`]).
    look: bool,
    /// The fence of the lease the waiter that left last was granted: a
    /// change of an older lease (a release heard after a handoff) is
    /// stale and wakes nobody.
    held_fence: Option<u64>,
    /// Until when the waiter that left last holds the lock, when it left
    /// with a grant and no wake-up came since: the new head waits for that
    /// lease's release (or its end) rather than trying a lock it knows is
    /// held. A wake-up (a release, an extend, an expiry, a resync) clears it.
    held_until: Option<Instant>,
    /// How many wake-ups this queue has had: a waiter's mark (see
    /// [`Place::mark`]).
    wakes: u64,
}

impl Queue {
    /// Wakes the head, if anyone waits, and forgets what a waiter that left
    /// with a grant said of the lock: something changed since.
    fn wake_head(&mut self) {
        self.wakes = self.wakes.wrapping_add(1);
        self.held_until = None;
        if let Some(head) = self.waiters.front() {
            head.wake.notify_one();
        }
    }

    /// A waiter at the front was granted a shared lease: every shared
    /// waiter right behind it (up to the first that is not) tries at once,
    /// as a head does, rather than one after the other as each becomes
    /// head: a group of readers costs one round trip, not one each (the
    /// readers' turn of a fair reader-writer lock). An exclusive waiter
    /// keeps its place: no shared waiter behind it is admitted before it.
    fn admit_sharers(&mut self) {
        for waiter in self.waiters.iter().take_while(|w| w.shared) {
            if !waiter.admitted.swap(true, Ordering::AcqRel) {
                waiter.wake.notify_one();
            }
        }
    }

    /// The lock is held (a try was refused, or a waiter left holding it):
    /// only the head tries again, as for any queue.
    fn bar_sharers(&mut self) {
        for waiter in &self.waiters {
            if !waiter.admitted.swap(false, Ordering::AcqRel) {
                break;
            }
        }
    }

    /// Whether the waiter `id` tries now: it is the head, or a shared
    /// waiter admitted with the head's group.
    fn tries(&self, id: u64, admitted: &AtomicBool) -> bool {
        self.waiters.front().is_some_and(|w| w.id == id) || admitted.load(Ordering::Acquire)
    }
}

/// The wait queues of one lockd instance.
pub struct WaitQueues {
    queues: Mutex<HashMap<Subject, Queue>>,
    waiting: AtomicUsize,
    next_id: AtomicU64,
    max_waiters: usize,
    /// The store's, when it subscribes lock by lock.
    interest: OnceLock<Arc<dyn WaitInterest>>,
}

/// The queue is full: `max_waiters` requests are waiting already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

impl WaitQueues {
    /// Queues that hold at most `max_waiters` waiters in all.
    pub fn new(max_waiters: usize) -> Self {
        Self {
            queues: Mutex::new(HashMap::new()),
            waiting: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            max_waiters,
            interest: OnceLock::new(),
        }
    }

    /// Tells `interest` from now on which locks are waited for (see
    /// [`WaitInterest`]). Set once; a second call is ignored.
    pub fn tell(&self, interest: Arc<dyn WaitInterest>) {
        let _ = self.interest.set(interest);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Subject, Queue>> {
        // Every critical section leaves the map consistent before it can
        // panic, so a poisoned mutex is safe to use.
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`WaitQueues::join_with`] without a handoff, for an exclusive
    /// waiter.
    #[cfg(test)]
    pub fn join(self: &Arc<Self>, subject: &Subject) -> Result<Place, QueueFull> {
        self.join_with(subject, None, false)
    }

    /// Joins the back of `subject`'s queue, with the waiter's `handoff`
    /// when a release on this instance may make its try (see
    /// [`WaitQueues::offer`]); `shared` when it waits for a shared lease,
    /// which it may be granted beside the shared waiters ahead of it (see
    /// [`Place::admits_sharers`]). The place leaves the queue when it is
    /// dropped, and wakes the next waiter if it was the head.
    ///
    /// # Errors
    /// [`QueueFull`] when `max_waiters` requests are waiting already.
    pub fn join_with(
        self: &Arc<Self>,
        subject: &Subject,
        handoff: Option<Arc<Handoff>>,
        shared: bool,
    ) -> Result<Place, QueueFull> {
        let reserved = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_waiters).then_some(n + 1)
            });
        if reserved.is_err() {
            return Err(QueueFull);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        let place_handoff = handoff.clone();
        let mut queues = self.lock();
        let queue = queues.entry(subject.clone()).or_default();
        // Admitted flags are on a run of shared waiters from the front: a
        // shared waiter that joins right behind an admitted one (every
        // waiter is then shared and admitted) is admitted too.
        let admitted = shared
            && queue
                .waiters
                .back()
                .is_some_and(|w| w.admitted.load(Ordering::Acquire));
        let admitted = Arc::new(AtomicBool::new(admitted));
        queue.waiters.push_back(Waiter {
            id,
            wake: wake.clone(),
            handoff,
            shared,
            admitted: admitted.clone(),
        });
        drop(queues);
        Ok(Place {
            queues: self.clone(),
            subject: subject.clone(),
            id,
            wake,
            handoff: place_handoff,
            admitted,
        })
    }

    /// Wakes the head of `subject`'s queue, if anyone waits: it was
    /// released.
    #[cfg(test)]
    pub fn wake(&self, subject: &Subject) {
        if let Some(queue) = self.lock().get_mut(subject) {
            queue.wake_head();
        }
    }

    /// The head of `subject`'s queue's acquire, taken for a release on this
    /// instance to grant in its own step: when the head is parked with one
    /// (an exclusive lock's waiter that is not trying).
    pub fn offer(&self, subject: &Subject) -> Option<Offer> {
        let queues = self.lock();
        let head = queues.get(subject)?.waiters.front()?;
        let handoff = head.handoff.as_ref()?;
        handoff.take().then(|| Offer {
            handoff: handoff.clone(),
            wake: head.wake.clone(),
            done: false,
        })
    }

    /// Wakes the head of `subject`'s queue to look whether it is still
    /// held before it retries: a subscription to its releases was (re)made.
    pub fn wake_to_look(&self, subject: &Subject) {
        if let Some(queue) = self.lock().get_mut(subject)
            && let Some(head) = queue.waiters.front()
        {
            head.wake.notify_one();
            queue.look = true;
        }
    }

    /// Wakes the head of every queue: release events may have been missed
    /// (the event connection was re-established).
    pub fn wake_all(&self) {
        self.lock().values_mut().for_each(Queue::wake_head);
    }

    /// How many requests wait now, on every subject.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// How many requests wait for `subject` now.
    #[cfg(test)]
    fn waiting_for(&self, subject: &Subject) -> usize {
        self.lock().get(subject).map_or(0, |q| q.waiters.len())
    }

    /// Calls `each(subject, waiters)` for every lock and semaphore that
    /// has waiters now (for metrics, read at scrape time).
    pub fn for_each_queue(&self, mut each: impl FnMut(&Subject, usize)) {
        for (subject, queue) in self.lock().iter() {
            if !queue.waiters.is_empty() {
                each(subject, queue.waiters.len());
            }
        }
    }
}

impl ChangeListener for WaitQueues {
    fn changed(&self, subject: &Subject, change: &Change) {
        if !change.wakes_waiters() {
            return;
        }
        if let Some(queue) = self.lock().get_mut(subject) {
            // A change of a lease older than one a waiter here was granted
            // since (the release a handoff made, heard after it) is stale.
            let stale = change
                .fence()
                .zip(queue.held_fence)
                .is_some_and(|(fence, held)| fence < held);
            if !stale {
                queue.wake_head();
            }
        }
    }

    fn resync(&self) {
        self.wake_all();
    }

    fn subscribed(&self, subject: &Subject) {
        self.wake_to_look(subject);
    }
}

/// What the head of a queue is to do before it tries (see
/// [`Place::take_hint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// Try.
    Try,
    /// Look whether it is still held first (see
    /// [`ChangeListener::subscribed`]).
    Look,
    /// The waiter ahead left holding it until then: wait for its release.
    HeldUntil(Instant),
}

/// When the holder's lease ends, as a failed try learned it (see
/// [`Place::note_lease_end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEnd {
    /// By this instant at the latest.
    By(Instant),
    /// Never by itself: the lock's key has no TTL ([`LeaseLeft::NoTtl`]).
    NoTtl,
}

impl LeaseEnd {
    /// The end of a lease with `left` to run at `now`.
    pub fn after(now: Instant, left: LeaseLeft) -> Self {
        match left {
            LeaseLeft::AtMost(left) => Self::By(now + left),
            LeaseLeft::NoTtl => Self::NoTtl,
        }
    }

    /// What is left of the lease at `now` (at least 1 ms).
    pub fn left_at(self, now: Instant) -> LeaseLeft {
        match self {
            Self::By(end) => LeaseLeft::AtMost(
                end.saturating_duration_since(now)
                    .max(std::time::Duration::from_millis(1)),
            ),
            Self::NoTtl => LeaseLeft::NoTtl,
        }
    }
}

/// A place in a subject's queue.
pub struct Place {
    queues: Arc<WaitQueues>,
    subject: Subject,
    id: u64,
    wake: Arc<Notify>,
    handoff: Option<Arc<Handoff>>,
    /// Whether it tries beside the head (see [`Place::admits_sharers`]).
    admitted: Arc<AtomicBool>,
}

impl Place {
    /// Whether this place is at the head of its queue (the one that
    /// retries), or a shared waiter admitted with the head's group (see
    /// [`Place::admits_sharers`]).
    pub fn is_head(&self) -> bool {
        self.queues
            .lock()
            .get(&self.subject)
            .is_some_and(|q| q.tries(self.id, &self.admitted))
    }

    /// Says that this waiter, at the head (or admitted), was granted a
    /// shared lease: the shared waiters right behind it try at once too,
    /// until one of them is refused.
    pub fn admits_sharers(&self) {
        if let Some(queue) = self.queues.lock().get_mut(&self.subject) {
            queue.admit_sharers();
        }
    }

    /// Records when the holder's lease ends, as a failed try learned it, for
    /// every waiter of this lock to report. The first time for this lock,
    /// tells the store's [`WaitInterest`] that it is waited for. Shared
    /// waiters admitted with the head's group wait as others do again: it
    /// is held.
    pub fn note_lease_end(&self, end: LeaseEnd) {
        if let Some(queue) = self.queues.lock().get_mut(&self.subject) {
            queue.bar_sharers();
            queue.lease_end = Some(end);
            if !queue.subscribed
                && let Some(interest) = self.queues.interest.get()
            {
                queue.subscribed = true;
                interest.waiting(&self.subject);
            }
        }
    }

    /// What the head is to do before it tries (and forgets it: it is
    /// told once): look, when it was woken to look; wait, when the waiter
    /// ahead of it left holding the lock and nothing changed since.
    pub fn take_hint(&self) -> Hint {
        let mut queues = self.queues.lock();
        let Some(queue) = queues.get_mut(&self.subject) else {
            return Hint::Try;
        };
        if std::mem::take(&mut queue.look) {
            queue.held_until = None;
            return Hint::Look;
        }
        match queue.held_until.take() {
            Some(until) => Hint::HeldUntil(until),
            None => Hint::Try,
        }
    }

    /// A mark of this queue's wake-ups so far: taken before a try, so that
    /// [`Place::leaves_holding`] knows whether anything changed since.
    pub fn mark(&self) -> u64 {
        self.queues.lock().get(&self.subject).map_or(0, |q| q.wakes)
    }

    /// Says that this waiter leaves the queue (when it is dropped, next)
    /// granted the lock until `until`, with `fence`, by a try made at
    /// `mark`: the next
    /// waiter, woken as head, does not try before a release or that lease's
    /// end (one try fewer a handoff). When a wake-up came after `mark` (the
    /// new lease may be gone already), the next waiter tries at once, as
    /// for any waiter that leaves.
    pub fn leaves_holding(&self, until: Instant, fence: u64, mark: u64) {
        if let Some(queue) = self.queues.lock().get_mut(&self.subject) {
            queue.bar_sharers();
            queue.held_fence = Some(queue.held_fence.map_or(fence, |f| f.max(fence)));
            if queue.wakes == mark {
                queue.held_until = Some(until);
            }
        }
    }

    /// This place's handoff, when it has one.
    pub fn handoff(&self) -> Option<&Handoff> {
        self.handoff.as_deref()
    }

    /// When the holder's lease ends, as the last failed try of any waiter of
    /// this lock learned it.
    pub fn lease_end(&self) -> Option<LeaseEnd> {
        self.queues
            .lock()
            .get(&self.subject)
            .and_then(|q| q.lease_end)
    }

    /// Completes when this waiter is woken: it became head, or, as head, the
    /// lock was released. A wake-up sent before this is called is not lost.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // A release that takes its acquire from now on finds it gone (its
        // grant is the releaser's to undo). The wait took what was handed.
        if let Some(handoff) = &self.handoff {
            let _ = handoff.leave();
        }
        let mut queues = self.queues.lock();
        if let Some(queue) = queues.get_mut(&self.subject) {
            let was_head = queue.waiters.front().is_some_and(|w| w.id == self.id);
            queue.waiters.retain(|w| w.id != self.id);
            match queue.waiters.front() {
                None => {
                    if queue.subscribed
                        && let Some(interest) = self.queues.interest.get()
                    {
                        interest.idle(&self.subject);
                    }
                    queues.remove(&self.subject);
                }
                Some(next) if was_head => next.wake.notify_one(),
                Some(_) => {}
            }
        }
        drop(queues);
        self.queues.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::LockName;

    /// The lock named `name`.
    fn lock(name: &str) -> Subject {
        Subject::lock(LockName::parse(name).expect("a name"))
    }
    use std::time::Duration;

    #[tokio::test]
    async fn places_are_served_in_arrival_order() {
        let queues = Arc::new(WaitQueues::new(10));
        let first = queues.join(&lock("k")).expect("room");
        let second = queues.join(&lock("k")).expect("room");
        let other = queues.join(&lock("other")).expect("room");
        assert!(first.is_head());
        assert!(!second.is_head());
        assert!(other.is_head());
        assert_eq!(queues.waiting(), 3);
        drop(first);
        assert!(second.is_head());
        // The new head was woken when the old one left.
        tokio::time::timeout(Duration::from_secs(1), second.woken())
            .await
            .expect("woken");
        drop((second, other));
        assert_eq!(queues.waiting(), 0);
        assert_eq!(queues.waiting_for(&lock("k")), 0);
    }

    #[tokio::test]
    async fn a_release_wakes_the_head_only() {
        let queues = Arc::new(WaitQueues::new(10));
        let head = queues.join(&lock("k")).expect("room");
        let next = queues.join(&lock("k")).expect("room");
        queues.wake(&lock("k"));
        tokio::time::timeout(Duration::from_secs(1), head.woken())
            .await
            .expect("head woken");
        let next_woken = tokio::time::timeout(Duration::from_millis(50), next.woken()).await;
        assert!(
            next_woken.is_err(),
            "a waiter behind the head must sleep on"
        );
    }

    #[test]
    fn the_queue_refuses_waiters_beyond_the_limit() {
        let queues = Arc::new(WaitQueues::new(2));
        let a = queues.join(&lock("a")).expect("room");
        let _b = queues.join(&lock("b")).expect("room");
        assert!(queues.join(&lock("c")).is_err());
        drop(a);
        assert!(queues.join(&lock("c")).is_ok());
    }

    /// Records what a store is told, in order.
    #[derive(Default)]
    struct Told(Mutex<Vec<String>>);

    impl WaitInterest for Told {
        fn waiting(&self, subject: &Subject) {
            let name = subject.name().as_str();
            self.0.lock().expect("told").push(format!("+{name}"));
        }
        fn idle(&self, subject: &Subject) {
            let name = subject.name().as_str();
            self.0.lock().expect("told").push(format!("-{name}"));
        }
    }

    #[test]
    fn the_store_hears_of_a_lock_once_from_its_first_held_try_to_its_last_waiter() {
        let queues = Arc::new(WaitQueues::new(10));
        let told = Arc::new(Told::default());
        queues.tell(told.clone());
        // A wait that got its lock at once never subscribes.
        drop(queues.join(&lock("free")).expect("room"));
        let a = queues.join(&lock("k")).expect("room");
        let b = queues.join(&lock("k")).expect("room");
        a.note_lease_end(LeaseEnd::By(Instant::now()));
        b.note_lease_end(LeaseEnd::By(Instant::now()));
        drop(a);
        assert_eq!(*told.0.lock().expect("told"), ["+k"]);
        drop(b);
        // A new episode subscribes again.
        let c = queues.join(&lock("k")).expect("room");
        c.note_lease_end(LeaseEnd::By(Instant::now()));
        drop(c);
        assert_eq!(*told.0.lock().expect("told"), ["+k", "-k", "+k", "-k"]);
    }

    #[tokio::test]
    async fn a_readers_grant_admits_the_readers_behind_it_until_a_try_is_refused() {
        let queues = Arc::new(WaitQueues::new(10));
        let join = |shared| queues.join_with(&lock("k"), None, shared).expect("room");
        let (r1, r2, w, r3) = (join(true), join(true), join(false), join(true));
        assert!(r1.is_head() && !r2.is_head());
        r1.admits_sharers();
        tokio::time::timeout(Duration::from_secs(1), r2.woken())
            .await
            .expect("the reader behind is woken");
        assert!(r2.is_head(), "admitted beside the head");
        assert!(!w.is_head() && !r3.is_head(), "the writer keeps its place");
        drop(r1);
        // A refusal: only the head tries again.
        let (r4, r5) = (join(true), join(true));
        drop((w, r3));
        assert!(r2.is_head() && !r4.is_head() && !r5.is_head());
        r2.admits_sharers();
        assert!(r4.is_head() && r5.is_head());
        let r6 = join(true);
        assert!(r6.is_head(), "a reader joining the admitted group tries");
        r5.note_lease_end(LeaseEnd::By(Instant::now()));
        assert!(r2.is_head() && !r4.is_head() && !r6.is_head());
        let r7 = join(true);
        assert!(!r7.is_head());
    }

    #[test]
    fn a_waiter_leaving_from_the_middle_keeps_the_order() {
        let queues = Arc::new(WaitQueues::new(10));
        let a = queues.join(&lock("k")).expect("room");
        let b = queues.join(&lock("k")).expect("room");
        let c = queues.join(&lock("k")).expect("room");
        drop(b);
        drop(a);
        assert!(c.is_head());
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_holding_lets_the_next_wait_for_its_release() {
        let queues = Arc::new(WaitQueues::new(10));
        let until = Instant::now() + Duration::from_secs(10);
        let a = queues.join(&lock("k")).expect("room");
        let b = queues.join(&lock("k")).expect("room");
        let mark = a.mark();
        a.leaves_holding(until, 7, mark);
        drop(a);
        // b is woken as head, and told the lock is held until then.
        tokio::time::timeout(Duration::from_secs(1), b.woken())
            .await
            .expect("woken");
        assert_eq!(b.take_hint(), Hint::HeldUntil(until));
        assert_eq!(b.take_hint(), Hint::Try, "told once");
        // A release event after that: b tries.
        let c = queues.join(&lock("k")).expect("room");
        let mark = b.mark();
        b.leaves_holding(until, 7, mark);
        queues.wake(&lock("k"));
        drop(b);
        assert_eq!(c.take_hint(), Hint::Try, "the release event came after");
    }

    #[test]
    fn a_wake_up_during_the_try_that_granted_means_the_next_tries_at_once() {
        let queues = Arc::new(WaitQueues::new(10));
        let a = queues.join(&lock("k")).expect("room");
        let b = queues.join(&lock("k")).expect("room");
        let mark = a.mark();
        // The lease the try gets may be released, extended or broken
        // before the try's answer is read: its event wakes the queue.
        queues.wake(&lock("k"));
        a.leaves_holding(Instant::now() + Duration::from_secs(10), 7, mark);
        drop(a);
        assert_eq!(b.take_hint(), Hint::Try);
        // A resync clears what was said too.
        let c = queues.join(&lock("k")).expect("room");
        let mark = b.mark();
        b.leaves_holding(Instant::now() + Duration::from_secs(10), 7, mark);
        queues.wake_all();
        drop(b);
        assert_eq!(c.take_hint(), Hint::Try);
    }

    #[test]
    fn a_look_comes_before_what_the_waiter_ahead_said() {
        let queues = Arc::new(WaitQueues::new(10));
        let a = queues.join(&lock("k")).expect("room");
        let b = queues.join(&lock("k")).expect("room");
        let mark = a.mark();
        a.leaves_holding(Instant::now() + Duration::from_secs(10), 7, mark);
        drop(a);
        queues.wake_to_look(&lock("k"));
        assert_eq!(b.take_hint(), Hint::Look);
        assert_eq!(b.take_hint(), Hint::Try, "the look replaces it");
    }
}
